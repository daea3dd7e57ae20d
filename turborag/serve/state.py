"""What the routes of one app share: what is served, the model worker, metrics, the key and limits.

One `ServerState` per app, kept on `app.state.server`; routes receive it through the `StateDep` dependency
instead of closing over locals of `create_app`, so each route lives in the module of its concern.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request

from turborag.core.batch import DecodeBatch
from turborag.core.defaults import DEFAULT_MAX_BATCH, DEFAULT_PREFILL_BUDGET, DEFAULT_PREFILL_STEP
from turborag.core.engine import Engine, PromptTooLong
from turborag.core.feeds import feed_together
from turborag.core.generate import DecodeState
from turborag.serve.access import EVERYTHING, Access, Principal, key_hash
from turborag.serve.errors import APIError, forbidden
from turborag.serve.metrics import Metrics
from turborag.serve.worker import Generation, Job, ModelWorker, QueueFull, ShuttingDown, Turns, step_alone
from turborag.store.catalog import StoreError
from turborag.store.errors import StoreUnavailable
from turborag.store.write_quota import QuotaExceeded, WriteBudget, WriteQuota

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_QUESTION_TOKENS = 1024
DEFAULT_MAX_PROMPT_TOKENS = 8192
DEFAULT_MAX_UPLOADS_PER_KEY = 2
# A text longer than this many characters per allowed token is refused before the tokenizer runs, which
# takes seconds on megabytes. Prose has about 4 characters a token, code with runs of spaces more: twice that
# leaves a margin, so that only a text that would be over its cap in tokens too is refused unread.
CHARS_PER_TOKEN = 8


@dataclass
class Served:
    """What the server serves: an engine, and optionally a store with retrieval and document management."""

    engine: Engine
    model_name: str
    retriever: Any = None  # has .search(question, k) -> hits; a turborag.serve.served_store.ServedStore
    documents: Any = None  # has .add/.list/.delete; a turborag.serve.served_store.ServedStore
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


@dataclass(frozen=True)
class Limit:
    """A per-request bound on a text the model must read: `setting` names the server's setting in the
    message, so a client knows which cap it met (and an operator which option raises it)."""

    what: str  # "question", "prompt"
    setting: str  # "max_question_tokens", "max_prompt_tokens"
    tokens: int
    param: str  # the request field the text came from

    def check_chars(self, chars: int) -> None:
        """400 for a text too long to be within the cap whatever the tokenizer does, before it runs."""
        if chars > CHARS_PER_TOKEN * self.tokens:
            raise self._error(
                f"{self.what} of {chars} characters is over this server's limit of {self.tokens} tokens "
                f"({self.setting}; at most {CHARS_PER_TOKEN * self.tokens} characters)"
            )

    def check_tokens(self, tokens: int) -> None:
        if tokens > self.tokens:
            raise self._error(
                f"{self.what} of {tokens} tokens is over this server's limit of {self.tokens} tokens "
                f"({self.setting})"
            )

    def _error(self, message: str) -> APIError:
        return APIError(400, message, code="context_length_exceeded", param=self.param)


async def unless_gone(request: Request | None, work: Awaitable[T], job: Job) -> T:
    """`await work`, unless the client closes the connection first: then the job is cancelled (the worker
    drops it at its next iteration, freeing its batch slot) and the request ends with a 499, which nobody
    reads but /metrics counts. A non-streamed answer has no send that would fail when its client leaves, so
    without this the model would go on generating for nobody. The request's body must have been read."""
    if request is None:
        return await work
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(client_left(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done() or not gone.result():
            return await task
        job.cancel()
        raise APIError(499, "client closed the request", code="client_disconnected")
    finally:
        for t in (task, gone):
            t.cancel()


async def client_left(request: Request) -> bool:
    """True once the client has closed the connection: with the body read, the next ASGI message is the
    disconnect. (Not a poll of `request.is_disconnected()`: behind Starlette's BaseHTTPMiddleware, which the
    guard is, its cancelled receive never reported the disconnect.) False if the server cannot tell."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except RuntimeError:  # a receive out of turn (BaseHTTPMiddleware's); then watch nothing
        return False
    return True


def shutting_down(e: ShuttingDown) -> APIError:
    """503 for a request refused or stopped because the server is shutting down (SIGTERM)."""
    return APIError(503, str(e), "server_error", "shutting_down", headers={"Retry-After": "1"})


class ServerState:
    def __init__(
        self,
        served: Served,
        api_key: str | None,
        max_queue: int,
        max_body_bytes: int,
        max_batch: int = DEFAULT_MAX_BATCH,
        prefill_budget: int = DEFAULT_PREFILL_BUDGET,
        access: Access | None = None,
        metrics_key: str | None = None,
        max_question_tokens: int = DEFAULT_MAX_QUESTION_TOKENS,
        max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
        max_uploads_per_key: int = DEFAULT_MAX_UPLOADS_PER_KEY,
        prefill_step: int = DEFAULT_PREFILL_STEP,
        max_cache_bytes_per_key: int | None = None,
    ):
        if max_question_tokens < 1 or max_prompt_tokens < 1 or max_uploads_per_key < 1:
            raise ValueError("max_question_tokens, max_prompt_tokens and max_uploads_per_key must be >= 1")
        # Uploads in progress per key: an upload holds the model for its whole ingest, so one key sending
        # many at once would take the server from everyone else (each is at most max_body_bytes).
        self.max_uploads_per_key = max_uploads_per_key
        # tokens of one prefill forward (Engine.begin_steps' step): within the budget, so that one forward
        # never takes an iteration past it
        self.prefill_step = min(prefill_step, prefill_budget)
        self._uploads: dict[str, int] = {}
        engine = served.engine
        together = None
        if max_batch > 1:
            batch = DecodeBatch(engine.lm.model, engine.windows)
            step, on_idle = batch.step, batch.clear
            # the prefill forwards of requests admitted together run as one (core/feeds.py)
            together = functools.partial(feed_together, windows=engine.windows)
        else:  # one request at a time: exactly the single-request decode
            step, on_idle = functools.partial(step_alone, step_one=engine.step), None
        self.worker = ModelWorker(max_queue, step, max_batch, prefill_budget, on_idle, together)
        self.metrics = Metrics()
        self.served = served
        self.engine = served.engine
        # `--api-key` is one more key, allowed everything; without any key the API is open
        self.access = (access or Access()).with_key(api_key)
        self.metrics_key = metrics_key
        self.max_body_bytes = max_body_bytes
        # Bounds on what one request may ask the model to read, checked before any model work: a question
        # of thousands of tokens held the model (and every other request) for a minute.
        self.max_question_tokens = max_question_tokens
        self.max_prompt_tokens = max_prompt_tokens
        root = getattr(served.documents, "root", None)
        # the bytes of chunk caches each key's own passages may add to the store (None: no quota)
        quota = max_cache_bytes_per_key
        self.write_quota = WriteQuota(root, quota) if quota and root else None
        # the store's location as a server path, in every spelling a message could carry it
        self._paths = sorted({str(root), str(Path(root).resolve())}, key=len, reverse=True) if root else []

    def question_limit(self) -> Limit:
        return Limit("question", "max_question_tokens", self.max_question_tokens, "messages")

    def prompt_limit(self, param: str) -> Limit:
        return Limit("prompt", "max_prompt_tokens", self.max_prompt_tokens, param)

    def check_model(self, name: str) -> None:
        """Accept the served model's name, or "turborag" for a client that does not know it."""
        if name not in (self.served.model_name, "turborag"):
            raise APIError(
                404,
                f"model {name!r} not found; this server serves {self.served.model_name!r}, "
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

    def may_use_model(self, request: Request) -> None:
        """403 unless the request's key may read some collection: answering is reading (a write-only key, such
        as an ingestion key, must not get the model's time through plain chat or completions)."""
        if not self.principal(request).read:
            raise forbidden("this API key has no read scope; using the model needs a key that may read")

    @contextlib.contextmanager
    def upload_slot(self, request: Request) -> Iterator[None]:
        """Hold one of the request's key's `max_uploads_per_key` upload slots, or 429 with Retry-After.
        Used on the event loop only, so the count needs no lock."""
        who = self.prefix_partition(request) or "open"
        if self._uploads.get(who, 0) >= self.max_uploads_per_key:
            raise APIError(
                429,
                f"this key has {self.max_uploads_per_key} uploads in progress; retry when one is done",
                "rate_limit_error",
                "too_many_uploads",
                headers={"Retry-After": "5"},
            )
        self._uploads[who] = self._uploads.get(who, 0) + 1
        try:
            yield
        finally:
            self._uploads[who] -= 1

    def prefix_partition(self, request: Request) -> str:
        """The prompt-cache partition of the request's key (its hash; "" on an open server, which has one
        user): a key never gets `cached_tokens`, nor the time they save, from another key's prompts, which
        would tell it what that key sent. By key rather than by name: two keys may share a name."""
        if not self.access.required:
            return ""
        _scheme, _, key = request.headers.get("authorization", "").partition(" ")
        return key_hash(key.strip())

    def keep_passages(self, request: Request, collection: str) -> bool | WriteBudget:
        """How the chunk caches of a request's own passages are kept (Engine.begin_steps' `persist`): in RAM
        only for a key that may not write `collection`, so that no reader grows the store; stored for a key
        that may, charged to its quota when the server has one (429 beyond it)."""
        p = self.principal(request)
        if not p.can_write(collection) or getattr(self.served.documents, "read_only", False):
            return False
        return self.write_quota.budget(p.name) if self.write_quota else True

    def may_write(self, request: Request, collection: str) -> None:
        """403 unless the request's key may write `collection` (upload, delete, create, drop) and this server
        is not a read-only replica."""
        if getattr(self.served.documents, "read_only", False):
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
        if self.served.documents is None:
            raise APIError(404, "this server has no document store (start it with --store)", code="no_store")
        return self.served.documents

    def update_queue_depth(self) -> None:
        self.metrics.queue_depth.set(self.worker.depth)

    async def start(
        self,
        run: Callable[[], Iterator] | None = None,
        begin: Callable[[], DecodeState] | None = None,
        request: Request | None = None,
        turns: Callable[[], Iterator] | None = None,
    ) -> Started:
        """Queue a plain job (`run`) or a generation (`begin`, decoded in the batch); await its first item so
        that request errors become HTTP errors, not broken streams. With `request`, a client that leaves
        while the job waits in the queue or prefills cancels it (a 499 nobody reads)."""
        try:
            if turns is not None:
                job = self.worker.submit(Turns(turns))
            else:
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
            first = await unless_gone(request, items.__anext__(), job)
        except PromptTooLong as e:
            raise APIError(400, str(e), code="context_length_exceeded") from None
        except QuotaExceeded as e:
            raise APIError(429, str(e), "rate_limit_error", "quota_exceeded") from None
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

    async def in_turns(self, steps: Callable[[], Iterator]) -> Any:
        """The result of a job run one forward batch at a time among the other requests' prefills and
        decode steps (serve/turns.py: an upload's ingest)."""
        started = await self.start(turns=steps)
        return started.first

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
