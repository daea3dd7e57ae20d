"""LlamaIndex on a running `turborag serve`: `OpenAILike` pointed at its OpenAI-compatible API.

    turborag ingest ~/notes            # or upload through POST /v1/documents
    turborag serve &                   # http://127.0.0.1:8000/v1
    pip install llama-index-llms-openai-like
    python examples/llamaindex_example.py "When is the library open?" --mode turbo --top-k 5

The server retrieves the top-k chunks of the collection and answers from their precomputed KV caches. The
`turborag` object of the request body chooses the cache mode, top-k and collection; `additional_kwargs` are
passed to every `chat.completions.create` call, so `extra_body` carries it. The raw OpenAI response keeps
the server's `turborag` field: the chunks used, the mode and the TTFT.
"""

from __future__ import annotations

import argparse

from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike


def main(
    base_url: str = "http://127.0.0.1:8000/v1",
    question: str = "What is this collection about?",
    api_key: str = "none",  # any string, unless the server was started with --api-key or --keys
    mode: str = "turbo",
    top_k: int = 5,
    collection: str = "default",
    max_tokens: int = 64,
) -> dict:
    options = {"mode": mode, "top_k": top_k, "collection": collection}
    llm = OpenAILike(
        api_base=base_url,
        api_key=api_key,
        model="turborag",  # the server also answers to its model's own name
        is_chat_model=True,
        context_window=32768,  # the served model's window (the default model's); LlamaIndex plans with it
        temperature=0,
        max_tokens=max_tokens,
        additional_kwargs={"extra_body": {"turborag": options}},  # sent with every request
    )
    messages = [ChatMessage(role="user", content=question)]
    reply = llm.chat(messages)
    info = reply.raw.model_extra["turborag"]  # what the server did: chunks, mode, ttft_s, computed_chunks
    used = ", ".join(c["name"] for c in info["chunks"])
    print(f"{reply.message.content}\n({info['mode']}, TTFT {info['ttft_s']:.3f} s, passages: {used})")

    streamed = ""
    for part in llm.stream_chat(messages):  # the same answer, token by token
        print(part.delta or "", end="", flush=True)
        streamed += part.delta or ""
    print()
    return {"answer": reply.message.content, "streamed": streamed, "turborag": info}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="Ask a turborag server through LlamaIndex.")
    p.add_argument("question")
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--api-key", default="none")
    p.add_argument("--mode", default="turbo")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--collection", default="default")
    a = p.parse_args()
    main(a.base_url, a.question, a.api_key, a.mode, a.top_k, a.collection)
