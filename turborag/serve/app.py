"""OpenAI-compatible HTTP server (FastAPI): point an `openai` client's base URL here; RAG answers start fast.

Request path: HTTP handler (event loop: validate, authenticate, enqueue) -> ModelWorker thread (retrieve,
assemble caches, prefill the question, decode) -> tokens back to the handler -> JSON or SSE.

- `POST /v1/chat/completions`: the last user message is the question. With a store, the top-k chunks are
  retrieved and answered in turbo mode by default. Extension field `turborag`:
  `{"mode": ..., "top_k": int, "contexts": [str], "retrieve": bool}`; `contexts` replaces retrieval,
  `retrieve: false` (or a server without a store) answers the conversation as a plain prompt with prompt
  caching (core/prefix_cache.py). `usage.prompt_tokens_details.cached_tokens` counts prompt tokens served
  from precomputed caches; the response names the chunks used (`turborag.chunks`).
- `POST /v1/completions`: a plain prompt, prompt-cached. `GET /v1/models`.
- `POST /v1/documents`, `GET /v1/documents`, `DELETE /v1/documents/{id}`, per collection.
- `GET /v1/collections`, `POST /v1/collections`, `DELETE /v1/collections/{name}`.
- Keys (access.py): each may read some collections and write some; outside its scope a request gets 403.
- `GET /health`, `GET /metrics` (Prometheus text format).
- `GET /`: a web page (page_routes.py, static/) to upload documents, ask and compare full with turbo.
- Browsers (origin.py): a Host the server does not answer to gets 421 (DNS rebinding), a state-changing
  request from another origin 403 (CSRF), a JSON body not declared `application/json` 415; every response
  carries nosniff, `X-Frame-Options: DENY`, `Referrer-Policy: no-referrer` and the page's CSP.

Errors use OpenAI's body `{"error": {"message", "type", "param", "code"}}` and never carry a stack trace,
routing's own included: a wrong path is a 404 listing the endpoints, a wrong method a 405 with `Allow`.

Where things are: request bodies and limits in schemas.py; errors, body parsing and the guard middleware
(size, API key) in errors.py; Host, Origin and security headers in origin.py; the state shared by the
routes in state.py; response and SSE shaping in responses.py; the routes in openai_routes.py,
monitoring_routes.py and documents_routes.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from fastapi import FastAPI
from starlette.exceptions import HTTPException

from turborag.core.defaults import DEFAULT_MAX_BATCH, DEFAULT_PREFILL_BUDGET, DEFAULT_PREFILL_STEP
from turborag.serve import (
    collections_routes,
    documents_routes,
    monitoring_routes,
    openai_routes,
    page_routes,
)
from turborag.serve.access import Access
from turborag.serve.errors import APIError, api_error_handler, guard, http_error_handler
from turborag.serve.origin import HostPolicy, OriginChecks, SecurityHeaders
from turborag.serve.schemas import MAX_BODY_BYTES
from turborag.serve.state import (
    DEFAULT_MAX_PROMPT_TOKENS,
    DEFAULT_MAX_QUESTION_TOKENS,
    DEFAULT_MAX_UPLOADS_PER_KEY,
    Served,
    ServerState,
)


def create_app(
    served: Served,
    api_key: str | None = None,
    max_queue: int = 64,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_batch: int = DEFAULT_MAX_BATCH,
    prefill_budget: int = DEFAULT_PREFILL_BUDGET,
    access: Access | None = None,
    metrics_key: str | None = None,
    hosts: HostPolicy | None = None,
    max_question_tokens: int = DEFAULT_MAX_QUESTION_TOKENS,
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    max_uploads_per_key: int = DEFAULT_MAX_UPLOADS_PER_KEY,
    prefill_step: int = DEFAULT_PREFILL_STEP,
    max_cache_bytes_per_key: int | None = None,
) -> FastAPI:
    """An app serving `served`; it starts its own model worker thread, which decodes up to `max_batch`
    requests together and prefills at most about `prefill_budget` tokens between two decode steps.
    `access` holds the scoped keys (`--keys`), `api_key` one more key allowed everything; with neither the
    API is open. `metrics_key` guards `/metrics`. `hosts` are the Host headers answered (`turborag serve`
    passes its bind address and `--allowed-host` values); None answers any Host, for an app embedded or
    tested on its own. Cross-origin checks and security headers apply either way. A question may have at
    most `max_question_tokens` tokens, a prompt `max_prompt_tokens` (400 beyond, before any model work);
    a key may have `max_uploads_per_key` uploads in progress (429 beyond); prompts are prefilled in forwards
    of at most `prefill_step` tokens, between decode steps. A key that may write a collection may add at
    most `max_cache_bytes_per_key` bytes of chunk caches with its own passages (429 beyond; None: none)."""
    app = FastAPI(title="turborag", docs_url=None, redoc_url=None)
    state = ServerState(
        served,
        api_key,
        max_queue,
        max_body_bytes,
        max_batch,
        prefill_budget,
        access,
        metrics_key,
        max_question_tokens,
        max_prompt_tokens,
        max_uploads_per_key,
        prefill_step,
        max_cache_bytes_per_key,
    )
    app.state.server = state
    # the same objects under their own names, for tests and benchmarks that watch (or patch) the worker
    app.state.worker, app.state.metrics, app.state.served = state.worker, state.metrics, served
    # Middleware added last runs first: the security headers wrap everything, the guard's own errors
    # included; the Host and Origin checks run inside the guard, so their refusals are counted in /metrics.
    app.add_middleware(OriginChecks, hosts=hosts)
    app.middleware("http")(guard)
    app.add_middleware(SecurityHeaders)
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(HTTPException, http_error_handler)  # routing's 404 and 405 included
    for routes in (
        openai_routes,
        monitoring_routes,
        documents_routes,
        collections_routes,
        page_routes,  # the web page at `/` (not in the OpenAPI paths)
    ):  # the order of the OpenAPI paths
        app.include_router(routes.router)
    return app


# Seconds uvicorn waits for open responses after SIGTERM before cancelling them. The model worker ends every
# generation at its next decode step once the server stops, so this is only a backstop (a long prefill).
GRACEFUL_SHUTDOWN_S = 3


def run_app(app: FastAPI, host: str, port: int, on_exit: Callable[[], None] | None = None) -> None:
    """Serve `app` with uvicorn until SIGTERM or Ctrl-C. On that signal the model worker stops at once (new
    requests get 503, running generations end at their next decode step) and `on_exit` runs (the CLI takes
    its server file back), before uvicorn's graceful shutdown, which otherwise would wait for every open
    response to finish generating."""
    import uvicorn

    worker = app.state.worker

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            worker.stop()
            if on_exit is not None:
                on_exit()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S
    )
    server = Server(config)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down, as `uvicorn.run` expects
        pass
    if not server.started:  # e.g. the port is taken (uvicorn has logged why)
        sys.exit(3)


__all__ = ["Served", "create_app", "run_app"]
