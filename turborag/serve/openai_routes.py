"""The OpenAI endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`.

A chat request's last user message is the question. It is answered from passages (the RAG path, in the
request's cache mode) when the request brings `turborag.contexts` or the server has a store to retrieve
from (unless `turborag.retrieve` is false); otherwise the whole conversation is a plain prompt, answered
with prompt caching like a completion. Retrieval runs in the job, on the worker thread: embedding the
question is model work too.

Route functions carry no return annotation: FastAPI would take one for a response model, changing the
OpenAPI schema and re-validating bodies that are already built.

Bounds: a question is at most `max_question_tokens`, a prompt (a completion's, a plain chat's
conversation, or a question with its `contexts`) at most `max_prompt_tokens`, checked before any model work;
a text over 8 characters per allowed token is refused before the tokenizer runs, and tokenizing runs off the
event loop, so that a huge prompt never stalls the other requests (`/health` included). Using the model at
all needs a key with read scope. A plain prompt's prefix cache is partitioned by key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi import APIRouter, Request

from turborag.core.engine import Engine, PromptTooLong
from turborag.core.generate import SamplingParams
from turborag.serve.errors import APIError, parse_body
from turborag.serve.responses import respond
from turborag.serve.schemas import ChatRequest, CompletionRequest, Message
from turborag.serve.state import Limit, ServerState, StateDep

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat(request: Request, state: StateDep):
    req: ChatRequest = await parse_body(request, ChatRequest, state.max_body_bytes)
    state.check_model(req.model)
    opts = req.turborag
    users = [m for m in req.messages if m.role == "user"]
    if not users or not users[-1].text().strip():
        raise APIError(400, "messages need a non-empty user message", param="messages")
    if opts.contexts is not None or (opts.retrieve and state.served.retriever is not None):
        if opts.contexts is None:  # retrieval reads the collection: the key must be allowed to
            state.may_read(request, opts.collection)
        else:
            state.may_use_model(request)
        question = users[-1].text()
        params = rag_params(state, req)
        await check_question(state, question, opts.contexts or [], params)
        return await answer_from_passages(state, req, question, params, request)
    state.may_use_model(request)
    engine = state.engine
    params = req.params(state.served.default_max_tokens)
    chars = sum(len(m.text()) for m in req.messages)
    ids = await bounded_ids(state.prompt_limit("messages"), chars, lambda: render_chat(engine, req.messages))
    return await answer_prompt(state, request, req, "chat", ids, params)


def rag_params(state: ServerState, req: ChatRequest) -> SamplingParams:
    """A RAG answer's sampling: a base model (plain template) stops at the end of its line unless the client
    chose stop strings."""
    plain = state.engine.layout.template == "plain"
    return req.params(state.served.default_max_tokens, newline_stop=plain and not req.stop)


async def check_question(
    state: ServerState, question: str, contexts: list[str], params: SamplingParams
) -> None:
    """400 before any model work and before the queue: a question over `max_question_tokens`, one that with
    the request's own passages is over `max_prompt_tokens`, or a prompt that with the answer cannot fit the
    model's context window (with retrieval: the question alone, as the retrieved passages are then fitted
    to the window on the worker)."""
    tok = state.engine.lm.tokenizer
    await bounded_ids(state.question_limit(), len(question), lambda: encode(tok, question))
    passages = [c for c in contexts if c.strip()]
    if contexts:
        limit = state.prompt_limit("turborag.contexts")
        texts = [*contexts, question]
        await bounded_ids(limit, sum(map(len, texts)), lambda: [i for t in texts for i in encode(tok, t)])
    param = "turborag.contexts" if passages else "messages"
    await must_fit(lambda: state.engine.check_fits(question, passages, params), param)


async def must_fit(check: Callable[[], object], param: str) -> None:
    """`check()` off the event loop (it tokenizes), its PromptTooLong a 400 naming `param`."""
    try:
        await asyncio.to_thread(check)
    except PromptTooLong as e:
        raise APIError(400, str(e), code="context_length_exceeded", param=param) from None


async def bounded_ids(limit: Limit, chars: int, tokenize: Callable[[], list[int]]) -> list[int]:
    """The token ids of a text the model is to read, within `limit`: refused by its length in characters
    before the tokenizer runs, then by its tokens. Tokenized off the event loop: megabytes take seconds, and
    meanwhile no other request, `/health` included, would be answered."""
    limit.check_chars(chars)
    ids = await asyncio.to_thread(tokenize)
    limit.check_tokens(len(ids))
    return ids


async def answer_prompt(
    state: ServerState,
    request: Request,
    req: CompletionRequest | ChatRequest,
    kind: str,
    ids: list[int],
    params: SamplingParams,
):
    """The answer to a plain prompt, prompt-cached within the key's own partition of the prefix cache, its
    prefill chunked (the worker runs its forwards between other requests' decode steps). One that cannot fit
    the model's context window is refused before it is queued."""
    engine, partition = state.engine, state.prefix_partition(request)
    param = "messages" if kind == "chat" else "prompt"
    await must_fit(lambda: engine.check_length(len(ids), params.max_new_tokens), param)
    started = await state.start(
        begin=lambda: engine.begin_prompt_steps(ids, params, partition, state.prefill_step, defer=True),
        request=request,
    )
    return await respond(state, started, kind, req, {"chunks": []} if kind == "chat" else {}, request)


async def answer_from_passages(
    state: ServerState, req: ChatRequest, question: str, params: SamplingParams, request: Request
):
    """The RAG answer: the request's own passages, or the top-k retrieved ones that fit the context."""
    engine, served, opts = state.engine, state.served, req.turborag
    contexts = [c for c in opts.contexts or [] if c.strip()]
    if opts.contexts is not None and not contexts:
        raise APIError(400, "turborag.contexts must hold non-empty passages", param="turborag.contexts")
    chunk_refs: list[dict] = []
    persist = state.keep_passages(request, opts.collection)

    # a generator: the worker runs it one prefill forward at a time (Engine.begin_steps), the question's
    # forward together with those of other requests (defer: the worker runs the forwards)
    def begin():
        step = state.prefill_step
        if opts.contexts is not None:
            return (
                yield from engine.begin_steps(
                    question, contexts, opts.mode, params, step, True, persist, opts.collection
                )
            )
        from turborag.rag import answer  # a server without a store never loads retrieval

        def search(q: str, k: int):
            return served.retriever.search(q, k, opts.collection)

        def named(found) -> None:  # with each chunk's text, so that a client (the page) can show what it read
            chunk_refs.extend({**served.retriever.chunk_ref(h), "text": h.text} for h in found.passages)

        steps = answer.begin_steps(
            engine, search, question, opts.mode, params, opts.top_k, named, step, True, opts.collection
        )
        return (yield from steps)

    started = await state.start(begin=begin, request=request)
    extra = {"chunks": chunk_refs}  # filled before the first token
    if opts.contexts is None:
        extra["collection"] = opts.collection
    return await respond(state, started, "chat", req, extra, request)


@router.post("/v1/completions")
async def completions(request: Request, state: StateDep):
    req: CompletionRequest = await parse_body(request, CompletionRequest, state.max_body_bytes)
    state.check_model(req.model)
    if not req.prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    state.may_use_model(request)
    engine = state.engine
    params = req.params(state.served.default_max_tokens)
    limit = state.prompt_limit("prompt")
    ids = await bounded_ids(
        limit, len(req.prompt), lambda: _bos(engine) + encode(engine.lm.tokenizer, req.prompt)
    )
    return await answer_prompt(state, request, req, "text", ids, params)


@router.get("/v1/models")
async def models(state: StateDep):
    model = {"id": state.served.model_name, "object": "model", "created": 0, "owned_by": "turborag"}
    return {"object": "list", "data": [model]}


def encode(tokenizer, text: str) -> list[int]:
    """A text's token ids, without the special tokens the tokenizer would add."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _bos(engine: Engine) -> list[int]:
    bos = engine.lm.tokenizer.bos_token_id
    return [bos] if bos is not None else []


def render_chat(engine: Engine, messages: list[Message]) -> list[int]:
    """Token ids of a conversation for a plain (no retrieval) answer: the model's chat template if it has
    one, else "System:/User:/Assistant:" lines (base models)."""
    tok = engine.lm.tokenizer
    if getattr(tok, "chat_template", None):
        msgs = [
            {"role": m.role if m.role != "developer" else "system", "content": m.text()} for m in messages
        ]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return encode(tok, text)
    lines = [f"{m.role.capitalize()}: {m.text()}" for m in messages]
    return _bos(engine) + encode(tok, "\n".join(lines) + "\nAssistant:")
