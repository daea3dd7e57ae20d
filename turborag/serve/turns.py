"""A callback-style job run one forward batch at a time among the model worker's other work (worker.Turns).

An upload's ingest is long (a 200 KB text is minutes of precompute on a CPU) and reports its progress through
a callback after each forward batch of chunk caches. Run as one job, it held the model, and every other
request waited for all of it. `InTurns` runs such a job in a helper thread that holds the model only between
the worker's grant and its next report: the work calls `turn(tokens)` after each forward batch, which hands
the model back to the worker and waits for the next grant. The worker side is a generator (`steps`) that the
worker advances like a prefill (one step: one batch), so questions and decode steps of other requests run
between two batches, within the worker's per-iteration token budget.

Exactly one of the two threads runs at any time, so the work may use the model and the worker's SQLite
connections as the worker itself would. Closing the generator (the client left, the server stops) sets
`cancelled`, which the work checks at its next turn and then cleans up after itself; the close returns once
it has.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator
from typing import Any

_TURN, _DONE, _ERROR = "turn", "done", "error"


class InTurns:
    """`work(turn)` run in a helper thread, one forward batch per step of `steps()`."""

    def __init__(self, work: Callable[[Callable[[int], None]], Any], cancelled: threading.Event):
        self.work = work
        self.cancelled = cancelled
        self._grant = threading.Semaphore(0)
        self._reports: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._thread = threading.Thread(target=self._main, name="turborag-turns", daemon=True)

    def steps(self) -> Generator[int, None, Any]:
        """The worker's side: each step lets the work run until its next batch is done and yields that batch's
        tokens; returns the work's result, or raises its error."""
        self._thread.start()
        try:
            while True:
                kind, value = self._take_turn()
                if kind == _DONE:
                    return value
                if kind == _ERROR:
                    raise value
                yield value
        except GeneratorExit:
            self.cancelled.set()
            while self._take_turn()[0] == _TURN:  # let it reach its next check and clean up
                pass
            raise

    def _take_turn(self) -> tuple[str, Any]:
        self._grant.release()
        return self._reports.get()

    def _main(self) -> None:
        self._grant.acquire()
        try:
            result = self.work(self._turn)
        except BaseException as e:  # handed to the worker, which hands it to the request
            self._reports.put((_ERROR, e))
        else:
            self._reports.put((_DONE, result))

    def _turn(self, tokens: int) -> None:
        """Called by the work after a forward batch: give the model back until the next grant."""
        self._reports.put((_TURN, tokens))
        self._grant.acquire()
