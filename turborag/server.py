"""OpenAI-compatible HTTP server (FastAPI): point an `openai` client's base URL here; RAG answers start fast.

Request path: HTTP handler (event loop: validate, authenticate, enqueue) -> ModelWorker thread (retrieve,
assemble caches, prefill the question, decode) -> tokens back to the handler -> JSON or SSE.

- `POST /v1/chat/completions`: the last user message is the question. With a store, the top-k chunks are
  retrieved and answered in turbo mode by default. Extension field `turborag`:
  `{"mode": ..., "top_k": int, "contexts": [str], "retrieve": bool}`; `contexts` replaces retrieval,
  `retrieve: false` (or a server without a store) answers the conversation as a plain prompt with prompt
  caching (prefix_cache.py). `usage.prompt_tokens_details.cached_tokens` counts prompt tokens served from
  precomputed caches; the response names the chunks used (`turborag.chunks`).
- `POST /v1/completions`: a plain prompt, prompt-cached. `GET /v1/models`.
- `POST /v1/documents` (JSON `{"name", "text"}` or a multipart file), `GET /v1/documents`,
  `DELETE /v1/documents/{id}`. Uploads are written under the store's own `uploads/` folder with a
  server-chosen name: a client never names a server path.
- `GET /health`, `GET /metrics` (Prometheus text format).

Errors use OpenAI's body `{"error": {"message", "type", "param", "code"}}` and never carry a stack trace.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, Field, ValidationError

from turborag.engine import MODES, Answer, Engine, PromptTooLong
from turborag.generate import SamplingParams
from turborag.worker import ModelWorker, QueueFull

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_TOKENS_LIMIT = 4096
MAX_TOP_K = 64


# ---------------------------------------------------------------------------------------------------------
# request bodies


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # [{"type": "text", "text": ...}, ...]
            return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")
        return self.content or ""


class TurboOptions(BaseModel):
    mode: Literal["full", "turbo", "turbo-composite", "turbo-epic", "turbo-blend"] = "turbo"
    top_k: int = Field(5, ge=1, le=MAX_TOP_K)
    contexts: list[str] | None = None
    retrieve: bool = True


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    model: str
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    def params(self, default_max: int, newline_stop: bool = False) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_new_tokens=self.max_completion_tokens or self.max_tokens or default_max,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=stop,
            stop_at_newline=newline_stop,
        )


class ChatRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1)
    turborag: TurboOptions = Field(default_factory=TurboOptions)


class CompletionRequest(SamplingFields):
    prompt: str


class DocumentRequest(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    text: str = Field(min_length=1)


# ---------------------------------------------------------------------------------------------------------
# errors


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def _validation_message(e: ValidationError) -> tuple[str, str | None]:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    return f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")), loc or None


# ---------------------------------------------------------------------------------------------------------
# the app


@dataclass
class Backend:
    """What the server serves: an engine, and optionally a store with retrieval and document management."""

    engine: Engine
    model_name: str
    retriever: Any = None  # turborag.ask.Retriever
    documents: Any = None  # turborag.server_docs.Documents
    default_max_tokens: int = 64
    extras: dict = field(default_factory=dict)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "turborag_requests_total", "HTTP requests", ["endpoint", "status"], registry=r
        )
        self.ttft = Histogram(
            "turborag_ttft_seconds",
            "time to first token",
            ["mode"],
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.prompt_tokens = Counter("turborag_prompt_tokens_total", "prompt tokens", ["kind"], registry=r)
        self.completion_tokens = Counter("turborag_completion_tokens_total", "generated tokens", registry=r)
        self.queue_depth = Gauge(
            "turborag_queue_depth", "requests waiting for or holding the model", registry=r
        )
        self.store_hits = Gauge("turborag_store_hits", "chunk caches read from the store", registry=r)
        self.store_misses = Gauge("turborag_store_misses", "chunk caches missing or damaged", registry=r)
        self.prefix_hits = Gauge(
            "turborag_prefix_cache_tokens", "prompt tokens served by prompt caching", registry=r
        )

    def observe(self, a: Answer) -> None:
        self.ttft.labels(a.mode).observe(a.ttft_s)
        self.prompt_tokens.labels("cached").inc(a.cached_tokens)
        self.prompt_tokens.labels("computed").inc(a.prompt_tokens - a.cached_tokens)
        self.completion_tokens.inc(a.completion_tokens)


def _usage(a: Answer) -> dict:
    return {
        "prompt_tokens": a.prompt_tokens,
        "completion_tokens": a.completion_tokens,
        "total_tokens": a.prompt_tokens + a.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": a.cached_tokens},
    }


def _sse(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def create_app(
    backend: Backend, api_key: str | None = None, max_queue: int = 64, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    app = FastAPI(title="turborag", docs_url=None, redoc_url=None)
    worker = ModelWorker(max_queue)
    metrics = Metrics()
    engine = backend.engine
    app.state.worker, app.state.metrics, app.state.backend = worker, metrics, backend

    @app.middleware("http")
    async def guard(request: Request, call_next):
        """Body size, API key and uniform error bodies for every endpoint."""
        endpoint = request.url.path
        try:
            length = request.headers.get("content-length")
            if length is not None and int(length) > max_body_bytes:
                raise APIError(413, f"request body over {max_body_bytes} bytes", code="body_too_large")
            if api_key and endpoint.startswith("/v1/"):
                auth = request.headers.get("authorization", "")
                if auth != f"Bearer {api_key}":
                    raise APIError(401, "missing or wrong API key", "authentication_error", "invalid_api_key")
            response = await call_next(request)
        except APIError as e:
            response = e.response()
        except Exception:  # never a stack trace in a response
            log.exception("internal error on %s", endpoint)
            response = APIError(500, "internal server error", "server_error").response()
        metrics.requests.labels(
            endpoint if not endpoint.startswith("/v1/documents/") else "/v1/documents/{id}",
            str(response.status_code),
        ).inc()
        return response

    @app.exception_handler(APIError)
    async def api_error(_request: Request, e: APIError):
        return e.response()

    async def body_of(request: Request, model: type[BaseModel]) -> Any:
        raw = await request.body()
        if len(raw) > max_body_bytes:
            raise APIError(413, f"request body over {max_body_bytes} bytes", code="body_too_large")
        try:
            data = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise APIError(400, "request body is not valid JSON", code="invalid_json") from None
        if not isinstance(data, dict):
            raise APIError(400, "request body must be a JSON object", code="invalid_json")
        try:
            return model.model_validate(data)
        except ValidationError as e:
            msg, param = _validation_message(e)
            raise APIError(400, msg, param=param, code="invalid_value") from None

    def check_model(name: str) -> None:
        if name not in (backend.model_name, "turborag"):
            raise APIError(
                404,
                f"model {name!r} not found; this server serves {backend.model_name!r}",
                code="model_not_found",
                param="model",
            )

    async def start(run) -> tuple[Any, Any]:
        """Queue a job; await its first item so that request errors become HTTP errors, not broken streams."""
        try:
            job = worker.submit(run)
        except QueueFull:
            raise APIError(
                503,
                "the model is busy: queue full, retry shortly",
                "server_error",
                "queue_full",
                headers={"Retry-After": "1"},
            ) from None
        metrics.queue_depth.set(worker.depth)
        items = job.items()
        try:
            first = await items.__anext__()
        except PromptTooLong as e:
            raise APIError(400, str(e), code="context_length_exceeded") from None
        except ValueError as e:
            raise APIError(400, str(e)) from None
        except StopAsyncIteration:
            first = None
        return job, (first, items)

    async def respond(job, head, kind: str, req: SamplingFields, extra: dict) -> Any:
        first, items = head
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        obj = "chat.completion" if kind == "chat" else "text_completion"

        def choice(text: str | None, finish: str | None, delta: bool) -> dict:
            if kind == "chat":
                body = {"content": text} if delta else {"role": "assistant", "content": text}
                return {
                    "index": 0,
                    ("delta" if delta else "message"): body,
                    "finish_reason": finish,
                    "logprobs": None,
                }
            return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}

        async def all_items():
            if first is not None:
                yield first
            async for it in items:
                yield it

        if not req.stream:
            parts, answer = [], None
            try:
                async for it in all_items():
                    if isinstance(it, Answer):
                        answer = it
                    else:
                        parts.append(it)
            finally:
                job.cancel()
            metrics.observe(answer)
            metrics.queue_depth.set(worker.depth)
            return JSONResponse(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": backend.model_name,
                    "choices": [choice(answer.text, answer.finish_reason, False)],
                    "usage": _usage(answer),
                    "turborag": {**extra, "mode": answer.mode, "ttft_s": answer.ttft_s},
                }
            )

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunk_obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

        async def events():
            try:
                if kind == "chat":
                    yield _sse(
                        {
                            "id": rid,
                            "object": chunk_obj,
                            "created": created,
                            "model": backend.model_name,
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None,
                                    "logprobs": None,
                                }
                            ],
                        }
                    )
                answer = None
                async for it in all_items():
                    if isinstance(it, Answer):
                        answer = it
                        continue
                    yield _sse(
                        {
                            "id": rid,
                            "object": chunk_obj,
                            "created": created,
                            "model": backend.model_name,
                            "choices": [choice(it, None, True)],
                        }
                    )
                final = {
                    "id": rid,
                    "object": chunk_obj,
                    "created": created,
                    "model": backend.model_name,
                    "choices": [choice("" if kind != "chat" else None, answer.finish_reason, True)],
                    "turborag": {**extra, "mode": answer.mode, "ttft_s": answer.ttft_s},
                }
                if kind == "chat":
                    final["choices"][0]["delta"] = {}
                yield _sse(final)
                if include_usage:
                    yield _sse(
                        {
                            "id": rid,
                            "object": chunk_obj,
                            "created": created,
                            "model": backend.model_name,
                            "choices": [],
                            "usage": _usage(answer),
                        }
                    )
                yield _sse("[DONE]")
                metrics.observe(answer)
            finally:  # also on client disconnect (the response task is cancelled): stop generating
                job.cancel()
                metrics.queue_depth.set(worker.depth)

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        req: ChatRequest = await body_of(request, ChatRequest)
        check_model(req.model)
        opts = req.turborag
        users = [m for m in req.messages if m.role == "user"]
        if not users or not users[-1].text().strip():
            raise APIError(400, "messages need a non-empty user message", param="messages")
        question = users[-1].text()
        plain = engine.layout.template == "plain"

        use_rag = opts.contexts is not None or (opts.retrieve and backend.retriever is not None)
        if use_rag:
            params = req.params(backend.default_max_tokens, newline_stop=plain and not req.stop)
            contexts = [c for c in opts.contexts or [] if c.strip()]
            if opts.contexts is not None and not contexts:
                raise APIError(
                    400, "turborag.contexts must hold non-empty passages", param="turborag.contexts"
                )
            chunk_ids: list[str] = []

            def run():
                passages = contexts
                if opts.contexts is None:  # retrieve in the worker: embedding is model work too
                    from turborag.ask import fit_passages

                    hits = backend.retriever.search(question, opts.top_k)
                    hits, _dropped = fit_passages(engine, question, hits, params.max_new_tokens)
                    passages = [h.text for h in hits]
                    chunk_ids.extend(h.chunk_id for h in hits)
                yield from engine.stream(question, passages, opts.mode, params)

            job, head = await start(run)
            return await respond(job, head, "chat", req, {"chunks": chunk_ids})  # filled before the 1st token

        params = req.params(backend.default_max_tokens)
        ids = render_chat(engine, req.messages)
        job, head = await start(lambda: engine.complete_stream(ids, params))
        return await respond(job, head, "chat", req, {"chunks": []})

    @app.post("/v1/completions")
    async def completions(request: Request):
        req: CompletionRequest = await body_of(request, CompletionRequest)
        check_model(req.model)
        if not req.prompt:
            raise APIError(400, "prompt must not be empty", param="prompt")
        params = req.params(backend.default_max_tokens)
        ids = _bos(engine) + list(engine.lm.tokenizer(req.prompt, add_special_tokens=False)["input_ids"])
        job, head = await start(lambda: engine.complete_stream(ids, params))
        return await respond(job, head, "text", req, {})

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": backend.model_name, "object": "model", "created": 0, "owned_by": "turborag"}],
        }

    @app.get("/health")
    async def health():
        return {
            "status": "ok",
            "model": backend.model_name,
            "queue_depth": worker.depth,
            "documents": backend.documents is not None,
        }

    @app.get("/metrics")
    async def prometheus():
        metrics.queue_depth.set(worker.depth)
        metrics.store_hits.set(engine.store.hits)
        metrics.store_misses.set(engine.store.misses)
        metrics.prefix_hits.set(engine.prefix_cache.hits)
        return PlainTextResponse(
            generate_latest(metrics.registry).decode(), media_type="text/plain; version=0.0.4"
        )

    # -- documents ---------------------------------------------------------------------------------

    def docs_or_404():
        if backend.documents is None:
            raise APIError(404, "this server has no document store (start it with --store)", code="no_store")
        return backend.documents

    @app.post("/v1/documents")
    async def add_document(request: Request):
        docs = docs_or_404()
        ctype = request.headers.get("content-type", "")
        if ctype.startswith("multipart/form-data"):
            form = await request.form()
            upload = form.get("file")
            if upload is None or not hasattr(upload, "read"):
                raise APIError(400, "multipart upload needs a 'file' field", param="file")
            data = await upload.read()
            if len(data) > max_body_bytes:
                raise APIError(413, f"file over {max_body_bytes} bytes", code="body_too_large")
            name = upload.filename or "upload.txt"
        else:
            req: DocumentRequest = await body_of(request, DocumentRequest)
            data, name = req.text.encode("utf-8"), req.name
        name = safe_name(name)
        job, head = await start(lambda: iter([docs.add(name, data)]))
        first, _items = head
        job.cancel()
        return JSONResponse(first, status_code=201)

    @app.get("/v1/documents")
    async def list_documents():
        docs = docs_or_404()
        job, (first, _items) = await start(lambda: iter([docs.list()]))  # the catalog lives on the worker
        job.cancel()
        return {"object": "list", "data": first}

    @app.delete("/v1/documents/{doc_id}")
    async def delete_document(doc_id: str):
        docs = docs_or_404()
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", doc_id):
            raise APIError(400, "malformed document id", param="doc_id")
        job, head = await start(lambda: iter([docs.delete(doc_id)]))
        first, _items = head
        job.cancel()
        if not first:
            raise APIError(404, f"no document {doc_id!r}", code="document_not_found")
        return {"id": doc_id, "object": "document", "deleted": True}

    return app


def safe_name(name: str) -> str:
    """A file name a client may not use to reach outside the uploads folder: no separators, no dot-files."""
    base = Path(name.replace("\\", "/")).name
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".") or "upload.txt"
    return base[:100]


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


__all__ = ["Backend", "create_app", "MODES"]
