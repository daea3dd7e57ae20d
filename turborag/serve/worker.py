"""One thread owns the model; HTTP requests wait for it in a bounded queue.

The event loop never runs model code: a request submits a job (a generator factory), and the worker thread
runs it, handing each item back to the request's asyncio queue. A full queue is refused at once (the server
answers 503 + Retry-After) rather than letting latency grow without bound. A job whose client went away is
cancelled: the worker checks between items (tokens) and closes the generator, so no compute is wasted on
a disconnected stream.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

_DONE = object()


class QueueFull(Exception):
    """The model's queue is full; retry later."""


@dataclass
class Job:
    run: Callable[[], Iterator]
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def _put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)

    async def items(self):
        """Async iterator over the job's items; re-raises an exception raised in the worker."""
        while True:
            item = await self.out.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def cancel(self) -> None:
        self.cancelled.set()


class ModelWorker:
    def __init__(self, max_queue: int = 64):
        self.jobs: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self.running = 0  # jobs being executed now (0 or 1)
        self.completed = 0
        self.cancelled = 0
        self._thread = threading.Thread(target=self._loop, name="turborag-model", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Jobs waiting plus the one running."""
        return self.jobs.qsize() + self.running

    def submit(self, run: Callable[[], Iterator]) -> Job:
        job = Job(run, asyncio.get_running_loop())
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull from None
        return job

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job.cancelled.is_set():
                self.cancelled += 1
                job._put(_DONE)
                continue
            self.running = 1
            gen = None
            try:
                gen = job.run()
                for item in gen:
                    if job.cancelled.is_set():
                        self.cancelled += 1
                        break
                    job._put(item)
            except BaseException as e:  # handed to the request, which turns it into an HTTP error
                job._put(e)
            finally:
                if gen is not None and hasattr(gen, "close"):
                    gen.close()
                self.running = 0
                self.completed += 1
                job._put(_DONE)
