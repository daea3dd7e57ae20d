"""LangChain on a running `turborag serve`: `ChatOpenAI` pointed at its OpenAI-compatible API.

    turborag ingest ~/notes            # or upload through POST /v1/documents
    turborag serve &                   # http://127.0.0.1:8000/v1
    pip install langchain-openai
    python examples/langchain_example.py "When is the library open?" --mode turbo --top-k 5

The server retrieves the top-k chunks of the collection and answers from their precomputed KV caches. The
`turborag` object of the request body (`extra_body`) chooses the cache mode, top-k and collection; LangChain
sends it with every request of this model, streamed or not. LangChain keeps only OpenAI's own fields of a
response, so the chunks the server used are not in its reply; the prompt tokens served from chunk caches
are (`usage_metadata["input_token_details"]["cache_read"]`).
"""

from __future__ import annotations

import argparse

from langchain_openai import ChatOpenAI


def main(
    base_url: str = "http://127.0.0.1:8000/v1",
    question: str = "What is this collection about?",
    api_key: str = "none",  # any string, unless the server was started with --api-key or --keys
    mode: str = "turbo",
    top_k: int = 5,
    collection: str = "default",
    max_tokens: int = 64,
) -> dict:
    llm = ChatOpenAI(
        base_url=base_url,
        api_key=api_key,
        model="turborag",  # the server also answers to its model's own name
        temperature=0,
        max_tokens=max_tokens,
        stream_usage=True,  # usage (with the cached tokens) on the last streamed chunk too
        extra_body={"turborag": {"mode": mode, "top_k": top_k, "collection": collection}},
    )
    reply = llm.invoke(question)
    cached = reply.usage_metadata["input_token_details"].get("cache_read", 0)
    print(f"{reply.content}\n({cached} of {reply.usage_metadata['input_tokens']} prompt tokens from caches)")

    streamed = ""
    for piece in llm.stream(question):  # the same answer, token by token
        print(piece.content, end="", flush=True)
        streamed += piece.content
    print()
    return {"answer": reply.content, "streamed": streamed, "cached_tokens": cached}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="Ask a turborag server through LangChain.")
    p.add_argument("question")
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--api-key", default="none")
    p.add_argument("--mode", default="turbo")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--collection", default="default")
    a = p.parse_args()
    main(a.base_url, a.question, a.api_key, a.mode, a.top_k, a.collection)
