"""The OpenAI endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`.

A chat request's last user message is the question. It is answered from passages (the RAG path, in the
request's cache mode) when the request brings `turborag.contexts` or the server has a store to retrieve
from (unless `turborag.retrieve` is false); otherwise the whole conversation is a plain prompt, answered
with prompt caching like a completion. Retrieval runs in the job, on the worker thread: embedding the
question is model work too.

Route functions carry no return annotation: FastAPI would take one for a response model, changing the
OpenAPI schema and re-validating bodies that are already built.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from turborag.core.engine import Engine
from turborag.serve.errors import APIError, parse_body
from turborag.serve.responses import respond
from turborag.serve.schemas import ChatRequest, CompletionRequest, Message
from turborag.serve.state import ServerState, StateDep

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat(request: Request, state: StateDep):
    req: ChatRequest = await parse_body(request, ChatRequest, state.max_body_bytes)
    state.check_model(req.model)
    opts = req.turborag
    users = [m for m in req.messages if m.role == "user"]
    if not users or not users[-1].text().strip():
        raise APIError(400, "messages need a non-empty user message", param="messages")
    if opts.contexts is not None or (opts.retrieve and state.backend.retriever is not None):
        if opts.contexts is None:  # retrieval reads the collection: the key must be allowed to
            state.may_read(request, opts.collection)
        return await answer_from_passages(state, req, users[-1].text())
    engine = state.engine
    params = req.params(state.backend.default_max_tokens)
    ids = render_chat(engine, req.messages)
    started = await state.start(begin=lambda: engine.begin_prompt(ids, params))
    return await respond(state, started, "chat", req, {"chunks": []})


async def answer_from_passages(state: ServerState, req: ChatRequest, question: str):
    """The RAG answer: the request's own passages, or the top-k retrieved ones that fit the context.
    A base model (plain template) stops at the end of its line unless the client chose stop strings."""
    engine, backend, opts = state.engine, state.backend, req.turborag
    plain = engine.layout.template == "plain"
    params = req.params(backend.default_max_tokens, newline_stop=plain and not req.stop)
    contexts = [c for c in opts.contexts or [] if c.strip()]
    if opts.contexts is not None and not contexts:
        raise APIError(400, "turborag.contexts must hold non-empty passages", param="turborag.contexts")
    chunk_refs: list[dict] = []

    def begin():
        passages = contexts
        if opts.contexts is None:
            from turborag.rag.retrieve import fit_passages  # a server without a store never loads it

            hits = backend.retriever.search(question, opts.top_k, opts.collection)
            hits, _dropped = fit_passages(engine, question, hits, params.max_new_tokens)
            passages = [h.text for h in hits]
            # with each chunk's text, so that a client (the web page) can show what the answer read
            chunk_refs.extend({**backend.retriever.chunk_ref(h), "text": h.text} for h in hits)
        return engine.begin(question, passages, opts.mode, params)

    started = await state.start(begin=begin)
    extra = {"chunks": chunk_refs}  # filled before the first token
    if opts.contexts is None:
        extra["collection"] = opts.collection
    return await respond(state, started, "chat", req, extra)


@router.post("/v1/completions")
async def completions(request: Request, state: StateDep):
    req: CompletionRequest = await parse_body(request, CompletionRequest, state.max_body_bytes)
    state.check_model(req.model)
    if not req.prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    engine = state.engine
    params = req.params(state.backend.default_max_tokens)
    ids = _bos(engine) + list(engine.lm.tokenizer(req.prompt, add_special_tokens=False)["input_ids"])
    started = await state.start(begin=lambda: engine.begin_prompt(ids, params))
    return await respond(state, started, "text", req, {})


@router.get("/v1/models")
async def models(state: StateDep):
    model = {"id": state.backend.model_name, "object": "model", "created": 0, "owned_by": "turborag"}
    return {"object": "list", "data": [model]}


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
        return list(tok(text, add_special_tokens=False)["input_ids"])
    lines = [f"{m.role.capitalize()}: {m.text()}" for m in messages]
    return _bos(engine) + list(tok("\n".join(lines) + "\nAssistant:", add_special_tokens=False)["input_ids"])
