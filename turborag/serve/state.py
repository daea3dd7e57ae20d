"""What the routes of one app share: the backend served, the model worker, metrics, the key and limits.

One `ServerState` per app, kept on `app.state.server`; routes receive it through the `StateDep` dependency
instead of closing over locals of `create_app`, so each route lives in the module of its concern.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request

from turborag.core.batch import DecodeBatch
from turborag.core.defaults import DEFAULT_MAX_BATCH, DEFAULT_PREFILL_BUDGET
from turborag.core.engine import Engine, PromptTooLong
from turborag.core.generate import DecodeState
from turborag.serve.access import EVERYTHING, Access, Principal
from turborag.serve.errors import APIError, forbidden
from turborag.serve.metrics import Metrics
from turborag.serve.worker import Generation, Job, ModelWorker, QueueFull, ShuttingDown, step_alone
from turborag.store.catalog import StoreError
from turborag.store.errors import StoreUnavailable

log = logging.getLogger(__name__)


@dataclass
class Backend:
    """What the server serves: an engine, and optionally a store with retrieval and document management."""

    engine: Engine
    model_name: str
    retriever: Any = None  # has .search(question, k) -> hits; a turborag.serve.store_backend.StoreBackend
    documents: Any = None  # has .add/.list/.delete; a turborag.serve.store_backend.StoreBackend
    default_max_tokens: int = 64
    extras: dict = field(default_factory=dict)


@dataclass
class Started:
    """A queued job whose first item has arrived (`first` is None if the job yielded nothing)."""

    job: Job
    first: Any
    rest: AsyncIterator

    async def items(self):
        """Every item of the job, the first one included."""
        if self.first is not None:
            yield self.first
        async for it in self.rest:
            yield it


def shutting_down(e: ShuttingDown) -> APIError:
    """503 for a request refused or stopped because the server is shutting down (SIGTERM)."""
    return APIError(503, str(e), "server_error", "shutting_down", headers={"Retry-After": "1"})


class ServerState:
    def __init__(
        self,
        backend: Backend,
        api_key: str | None,
        max_queue: int,
        max_body_bytes: int,
        max_batch: int = DEFAULT_MAX_BATCH,
        prefill_budget: int = DEFAULT_PREFILL_BUDGET,
        access: Access | None = None,
        metrics_key: str | None = None,
    ):
        engine = backend.engine
        if max_batch > 1:
            batch = DecodeBatch(engine.lm.model, engine.windows)
            step, on_idle = batch.step, batch.clear
        else:  # one request at a time: exactly the single-request decode
            step, on_idle = functools.partial(step_alone, step_one=engine.step), None
        self.worker = ModelWorker(max_queue, step, max_batch, prefill_budget, on_idle)
        self.metrics = Metrics()
        self.backend = backend
        self.engine = backend.engine
        # `--api-key` is one more key, allowed everything; without any key the API is open
        self.access = (access or Access()).with_key(api_key)
        self.metrics_key = metrics_key
        self.max_body_bytes = max_body_bytes
        root = getattr(backend.documents, "root", None)
        # the store's location as a server path, in every spelling a message could carry it
        self._paths = sorted({str(root), str(Path(root).resolve())}, key=len, reverse=True) if root else []

    def check_model(self, name: str) -> None:
        """Accept the served model's name, or "turborag" for a client that does not know it."""
        if name not in (self.backend.model_name, "turborag"):
            raise APIError(
                404,
                f"model {name!r} not found; this server serves {self.backend.model_name!r}, "
                "also accepted as 'turborag'",
                code="model_not_found",
                param="model",
            )

    def scrub(self, message: str) -> str:
        """A message fit for a client: the store's server path replaced by `<store>` (error messages of the
        store and of ingest name it, which is right on a command line and wrong over HTTP)."""
        for p in self._paths:
            message = message.replace(p, "<store>")
        return message

    def principal(self, request: Request) -> Principal:
        """Who sent the request (set by the guard middleware for every `/v1/` request)."""
        return getattr(request.state, "principal", EVERYTHING if not self.access.required else Principal("-"))

    def may_read(self, request: Request, collection: str) -> None:
        """403 unless the request's key may read `collection`."""
        p = self.principal(request)
        if not p.can_read(collection):
            raise forbidden(f"this API key may not read collection {collection!r}")

    def may_write(self, request: Request, collection: str) -> None:
        """403 unless the request's key may write `collection` (upload, delete, create, drop) and this server
        is not a read-only replica."""
        if getattr(self.backend.documents, "read_only", False):
            raise APIError(
                403,
                "this server is a read-only replica (serve --read-only): add and remove documents through "
                "`turborag ingest` or a server that owns the store",
                "permission_error",
                "read_only_replica",
            )
        p = self.principal(request)
        if not p.can_write(collection):
            raise forbidden(f"this API key may not write collection {collection!r}")

    def documents(self) -> Any:
        """The document store, or a 404 on a server started without one."""
        if self.backend.documents is None:
            raise APIError(404, "this server has no document store (start it with --store)", code="no_store")
        return self.backend.documents

    def update_queue_depth(self) -> None:
        self.metrics.queue_depth.set(self.worker.depth)

    async def start(
        self, run: Callable[[], Iterator] | None = None, begin: Callable[[], DecodeState] | None = None
    ) -> Started:
        """Queue a plain job (`run`) or a generation (`begin`, decoded in the batch); await its first item so
        that request errors become HTTP errors, not broken streams."""
        try:
            job = self.worker.submit(Generation(begin) if begin is not None else run)
        except QueueFull:
            raise APIError(
                503,
                "the model is busy: queue full, retry shortly",
                "server_error",
                "queue_full",
                headers={"Retry-After": "1"},
            ) from None
        except ShuttingDown as e:
            raise shutting_down(e) from None
        self.update_queue_depth()
        items = job.items()
        try:
            first = await items.__anext__()
        except PromptTooLong as e:
            raise APIError(400, str(e), code="context_length_exceeded") from None
        except ShuttingDown as e:
            raise shutting_down(e) from None
        except StoreUnavailable as e:  # e.g. an upload while the shared store is down: retry later
            retry = {"Retry-After": "5"}
            raise APIError(
                503, self.scrub(str(e)), "server_error", "store_unavailable", headers=retry
            ) from None
        except StoreError as e:  # e.g. a `turborag ingest` holds the store's write lock
            retry = {"Retry-After": "5"}
            raise APIError(409, self.scrub(str(e)), code="store_busy", headers=retry) from None
        except ValueError as e:
            raise APIError(400, self.scrub(str(e))) from None
        except OSError as e:  # disk full, permissions: the details (paths) stay in the server's log
            log.error("store write failed: %s", e)
            raise APIError(
                507, "the store could not be written", "server_error", "store_write_failed"
            ) from None
        except StopAsyncIteration:
            first = None
        return Started(job, first, items)

    async def call(self, fn: Callable[[], Any]) -> Any:
        """`fn()` run on the worker thread, for work that must not run on the event loop or must own the
        store's connections (which belong to the worker thread)."""
        started = await self.start(lambda: iter([fn()]))
        started.job.cancel()
        return started.first


async def get_state(request: Request) -> ServerState:
    """Dependency; async so that FastAPI calls it on the event loop rather than in its thread pool."""
    return request.app.state.server


StateDep = Annotated[ServerState, Depends(get_state)]
