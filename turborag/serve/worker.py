"""One thread owns the model and schedules every request on it: continuous batching of decode steps.

The event loop never runs model code: a request submits a job and awaits its items (text deltas, then the
Answer) from an asyncio queue. A full queue is refused at once (the server answers 503 + Retry-After) rather
than letting latency grow without bound.

A generation job brings `begin`: everything up to the first token (retrieval, cache assembly or full
prefill, the question's prefill), returning the sequence to decode. The worker loop, one iteration at a
time (Orca's iteration-level scheduling):

1. admit: take queued jobs while fewer than `max_batch` sequences run or prefill;
2. prefill (in steps, batched): a generation whose `begin` returns a step generator (Engine.begin_steps)
   is prefilled one forward of at most the server's `prefill_step` tokens at a time, first come first
   served, while the iteration's prefilled tokens stay within `prefill_budget` (`serve --max-batch-tokens`,
   padding of a batched forward counted); a
   sequence whose prefill is done picks its first token at once and joins the running ones. So a long
   prompt (a `full` request, a long question) never stalls the running decodes for more than about one
   budget of prefill, and a request cancelled during its prefill is dropped between two forwards. A
   generator that defers its forwards (`begin_steps(defer=True)` yields each as a Feed) has them run here:
   the forward first in line shares one forward with the pending forwards of the requests behind it
   (`feed_together`, core/feeds.py), as many as fit in the budget with padding counted, so the questions
   of the turbo requests admitted together are prefilled in one forward, reading the weights once. (A
   `begin` that returns the sequence directly prefills whole when admitted, and admission then stops once
   the iteration's prefilled tokens reach the budget.) Each sequence is prefilled exactly as alone (tested
   to 1e-4), so its first token is unchanged;
3. decode: one batched forward feeds every running sequence its next token (`step`);
4. retire: finished sequences hand out their Answer; cancelled ones (client gone) are dropped.

A plain job (`run`: an iterator, e.g. a document list) runs alone, to completion, when admitted; the
running decodes wait for it. A job in turns (`Turns`, e.g. a document upload's ingest) is a generator that
yields the tokens of each forward batch it ran and returns its result: it takes its turns among the prefills
(step 2), one forward batch at a time within the budget, so the questions and decode steps of other
requests go on while it runs; it is cancelled between two of its batches.

Shutdown (`stop`, on SIGTERM): new jobs are refused with `ShuttingDown` at once; between two decode steps
the worker ends every running and queued job with `ShuttingDown` (an HTTP 503, or an error event in a
stream), so the server's graceful shutdown, which waits for open responses, takes a step, not a generation.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field

import torch

from turborag.core.defaults import DEFAULT_PREFILL_BUDGET
from turborag.core.feeds import Feed, together
from turborag.core.generate import DecodeState

_DONE = object()


class QueueFull(Exception):
    """The model's queue is full; retry later."""


class ShuttingDown(Exception):
    """The server is shutting down: the job was refused, or stopped before it finished."""

    def __init__(self, message: str = "the server is shutting down; retry on another server or later"):
        super().__init__(message)


@dataclass
class Job:
    run: Callable[[], Iterator] | None  # a plain job: run alone, its items handed out as they come
    loop: asyncio.AbstractEventLoop
    # a generation: prefill (returns the sequence, or a generator of prefill steps that returns it), then
    # decoded in the batch
    begin: Callable[[], DecodeState | Generator] | None = None
    # a job in turns: its steps' generator (Turns), run among the prefills
    turns: Callable[[], Generator] | None = None
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def _put(self, item) -> None:
        """Hand an item to the request's event loop; if that loop is gone (the server shut down while the
        job ran), nobody can read it: the job is cancelled instead of killing the model thread."""
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)
        except RuntimeError:  # "Event loop is closed"
            self.cancelled.set()

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


@dataclass
class Generation:
    """What a generation request submits: `begin` prefills and returns the sequence to decode, or returns
    a generator that prefills one forward a step and returns the sequence (Engine.begin_steps)."""

    begin: Callable[[], DecodeState | Generator]


@dataclass
class Turns:
    """What a job in turns submits: `steps()` returns a generator that runs one forward batch a step,
    yielding its tokens, and returns the job's result (its only item)."""

    steps: Callable[[], Generator[int, None, object]]


Running = tuple[Job, DecodeState]  # a sequence being decoded


@dataclass
class Prefilling:
    """A sequence being prefilled, one forward a step."""

    job: Job
    steps: Generator  # yields a forward's token count (it ran the forward), or a Feed (run it, send logits)
    feed: Feed | None = None  # the forward it waits on
    fresh: bool = True  # not advanced yet: its retrieval and cache assembly have not run
    turns: bool = False  # a job in turns: its generator returns a result to hand out, not a sequence


def step_alone(rows: list[DecodeState], step_one: Callable[[DecodeState], None]) -> None:
    """A decode step without batching: one forward per sequence."""
    for r in rows:
        step_one(r)


class ModelWorker:
    """The model's thread. `step(rows)` feeds each running sequence its next token (a DecodeBatch's
    step, or one forward per sequence); without one, generations cannot be submitted."""

    def __init__(
        self,
        max_queue: int = 64,
        step: Callable[[list[DecodeState]], None] | None = None,
        max_batch: int = 1,
        prefill_budget: int = DEFAULT_PREFILL_BUDGET,
        on_idle: Callable[[], None] | None = None,
        feed_together: Callable[[list[Feed]], list[torch.Tensor]] | None = None,
    ):
        if max_batch < 1 or prefill_budget < 1:
            raise ValueError("max_batch and prefill_budget must be at least 1")
        self.jobs: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self.step = step
        self.max_batch = max_batch
        self.prefill_budget = prefill_budget
        self.on_idle = on_idle  # called when the last running sequence retires (free the batch buffers)
        # runs several requests' prefill forwards in one (core/feeds.py); None: each forward alone
        self.feed_together = feed_together
        self.prefill_forwards = 0  # prefill forwards the worker ran for deferred feeds (tests, metrics)
        self.prefill_feeds = 0  # deferred feeds they carried
        # the heaviest iteration so far: prompt tokens it prefilled (padding counted), and its seconds from
        # its first prefill forward to the end of its decode step (bench serve reports both)
        self.longest_prefill_tokens = 0
        self.longest_iteration_s = 0.0
        self.running = 0  # sequences being decoded (a plain job running alone counts as one)
        self.completed = 0
        self.cancelled = 0
        self.generated = 0  # tokens decoded, all requests
        self.tokens_per_s = 0.0  # decode throughput of the last iteration with running sequences
        # set once by `stop` (from a signal handler: a plain attribute, no lock to deadlock on)
        self.stopping = False
        self._thread = threading.Thread(target=self._loop, name="turborag-model", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Jobs waiting plus the ones running."""
        return self.jobs.qsize() + self.running

    def submit(self, work: Callable[[], Iterator] | Generation | Turns) -> Job:
        """Queue a plain job (a callable returning an iterator of items), a Generation or a job in Turns;
        raises QueueFull when the queue is, ShuttingDown once `stop` was called."""
        if self.stopping:
            raise ShuttingDown
        if isinstance(work, Generation | Turns):
            if self.step is None:
                raise ValueError("this worker has no decode step: submit generations as plain jobs")
            generation = isinstance(work, Generation)
            job = Job(None, asyncio.get_running_loop(), work.begin if generation else None)
            job.turns = None if generation else work.steps
        else:
            job = Job(work, asyncio.get_running_loop())
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull from None
        return job

    def stop(self) -> None:
        """Refuse new jobs, and end the running and queued ones before the next decode step. Safe to call
        from a signal handler."""
        self.stopping = True

    # -- the loop ----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        running: list[Running] = []
        prefilling: list[Prefilling] = []  # admitted, prefill under way (in steps), in order
        while True:
            if self.stopping:
                self._end_all(running, prefilling)
            self._admit(running, prefilling)
            running[:] = [(job, seq) for job, seq in running if not self._dropped(job)]
            prefilling[:] = [p for p in prefilling if not self._dropped(p.job, p.steps)]
            t_iter = time.perf_counter()
            spent = self._prefill(running, prefilling)
            self.longest_prefill_tokens = max(self.longest_prefill_tokens, spent)
            self.running = len(running) + len(prefilling)
            if not running:
                self._iteration_took(t_iter)
                if prefilling:
                    continue
                if self.on_idle is not None:
                    self.on_idle()
                continue
            t0 = time.perf_counter()
            try:
                self.step([seq for _, seq in running])
            except BaseException as e:  # every running request gets the error; the worker lives on
                for job, _ in running:
                    self._finish(job, e)
                running.clear()
                continue
            self.generated += len(running)
            self.tokens_per_s = len(running) / max(time.perf_counter() - t0, 1e-9)
            self._iteration_took(t_iter)
            running[:] = [(job, seq) for job, seq in running if not self._hand_out(job, seq)]
            self.running = len(running)

    def _admit(self, running: list[Running], prefilling: list[Prefilling]) -> None:
        """Take queued jobs while there is room (waiting for one only when nothing runs): a plain job runs
        alone at once, a generation joins `prefilling` (or, if its `begin` prefills in one call and returns
        the sequence, `running`)."""
        prefilled = 0
        while len(running) + len(prefilling) < self.max_batch and prefilled < self.prefill_budget:
            try:
                job = self.jobs.get(block=not (running or prefilling))
            except queue.Empty:
                return
            if job.cancelled.is_set():
                self.cancelled += 1
                job._put(_DONE)
                continue
            if self.stopping:  # queued before `stop`, taken after it
                self._finish(job, ShuttingDown())
                continue
            if job.turns is not None:
                prefilling.append(Prefilling(job, job.turns(), turns=True))
                continue
            if job.begin is None:
                self.running = len(running) + len(prefilling) + 1
                self._run_alone(job)
                # back to the sequences only: else an idle server reads 1 (/health, /metrics) until a next job
                self.running = len(running) + len(prefilling)
                continue
            try:
                begun = job.begin()
            except BaseException as e:  # handed to the request, which turns it into an HTTP error
                self._finish(job, e)
                continue
            if isinstance(begun, Generator):  # prefill steps (Engine.begin_steps)
                prefilling.append(Prefilling(job, begun))
                continue
            prefilled += max(1, begun.prompt_tokens - begun.cached_tokens)
            if not self._hand_out(job, begun):
                running.append((job, begun))
                self.running = len(running)

    def _iteration_took(self, t_iter: float) -> None:
        self.longest_iteration_s = max(self.longest_iteration_s, time.perf_counter() - t_iter)

    def _prefill(self, running: list[Running], prefilling: list[Prefilling]) -> int:
        """Advance the prefills one forward at a time, taking turns in arrival order (the one that just ran
        goes to the back), while the next forward fits in what is left of this iteration's `prefill_budget`
        tokens (the first forward of an iteration always runs); a finished prefill's sequence hands out its
        first token and joins `running`. A deferred forward (a Feed) is sized before it runs, so the budget
        holds exactly; a generator that runs its own forwards is known only after, and may end the
        iteration one forward past the budget.

        So a long prompt costs the running requests about one budget of prefill per decode step instead of
        its whole prefill at once, a short request that arrives behind it waits for one of its forwards,
        not all of them, and a cancelled or stopping request is dropped between two of its forwards. A
        deferred forward (a Feed) first in line takes the pending feeds behind it into the same forward.
        Returns the tokens prefilled (a batched forward's padding counted)."""
        spent = 0
        while prefilling and spent < self.prefill_budget:
            head = prefilling.pop(0)
            if head.feed is None:
                ran = self._advance(head, None, running)
                if ran is None:  # finished (or failed)
                    continue
                spent += ran
                if head.feed is None:  # it ran a forward itself: back of the line
                    prefilling.append(head)
                    continue
            if spent and spent + head.feed.tokens > self.prefill_budget:
                prefilling.insert(0, head)  # first in line in the next iteration
                break
            group = [head] + self._companions(head, prefilling, running, spent)
            for p in group[1:]:
                prefilling.remove(p)
            spent += len(group) * max(p.feed.tokens for p in group)
            prefilling.extend(self._run_feeds(group, running))
        return spent

    def _companions(
        self, head: Prefilling, prefilling: list[Prefilling], running: list[Running], spent: int
    ) -> list[Prefilling]:
        """The requests whose pending forwards share the head's: the ones behind it that may (plain
        attention, a cache already filled), in arrival order, while the forward's padded size (rows x the
        longest) fits in what is left of the budget. Requests admitted but not started are started first
        (retrieval and cache assembly), so that their questions are in hand."""
        if self.feed_together is None or not together(head.feed):
            return []
        for p in [p for p in prefilling if p.fresh]:
            ran = self._advance(p, None, running)
            if ran is None:
                prefilling.remove(p)
        room = max(self.prefill_budget - spent, head.feed.tokens)
        group, width = [], head.feed.tokens
        for p in prefilling:
            if p.feed is None or not together(p.feed):
                continue
            wider = max(width, p.feed.tokens)
            if (len(group) + 2) * wider > room:
                break
            group.append(p)
            width = wider
        return group

    def _advance(self, p: Prefilling, sent: torch.Tensor | None, running: list[Running]) -> int | None:
        """Send a prefill generator the logits of its last feed (or None) and take its next step: the
        tokens of a forward it ran itself, 0 when it now waits on a feed (`p.feed`), None when it finished
        (its sequence joined `running`, or it failed and the request got the error)."""
        p.fresh, p.feed = False, None
        try:
            step = p.steps.send(sent)
        except StopIteration as done:
            if p.turns:
                p.job._put(done.value)
                self._finish(p.job)
            elif not self._hand_out(p.job, done.value):
                running.append((p.job, done.value))
            return None
        except BaseException as e:  # handed to the request, which turns it into an HTTP error
            self._finish(p.job, e)
            return None
        if isinstance(step, Feed):
            p.feed = step
            return 0
        return step

    def _run_feeds(self, group: list[Prefilling], running: list[Running]) -> list[Prefilling]:
        """Run the group's feeds in one forward and hand each its logits; the ones still prefilling."""
        feeds = [p.feed for p in group]
        try:
            if len(feeds) > 1:
                results = self.feed_together(feeds)
            else:
                results = [feeds[0].run()]
        except BaseException as e:  # every request of the forward gets the error; the worker lives on
            for p in group:
                p.steps.close()
                self._finish(p.job, e)
            return []
        self.prefill_forwards += 1
        self.prefill_feeds += len(feeds)
        return [p for p, logits in zip(group, results) if self._advance(p, logits, running) is not None]

    def _end_all(self, running: list[Running], prefilling: list[Prefilling]) -> None:
        """Shutdown: every running, prefilling and queued job ends with ShuttingDown."""
        for p in prefilling:
            p.steps.close()
            self._finish(p.job, ShuttingDown())
        prefilling.clear()
        for job, _ in running:
            self._finish(job, ShuttingDown())
        running.clear()
        self.running = 0
        while True:
            try:
                self._finish(self.jobs.get_nowait(), ShuttingDown())
            except queue.Empty:
                return

    def _hand_out(self, job: Job, seq: DecodeState) -> bool:
        """Pick the sequence's next token and hand out what it releases; True once it has finished."""
        for item in seq.advance():
            job._put(item)
        if seq.finished:
            self._finish(job)
        return seq.finished

    def _dropped(self, job: Job, steps: Generator | None = None) -> bool:
        """A cancelled job ends here (its prefill, if one is under way, is abandoned)."""
        if job.cancelled.is_set():
            if steps is not None:
                steps.close()
            self.cancelled += 1
            self._finish(job)
            return True
        return False

    def _finish(self, job: Job, error: BaseException | None = None) -> None:
        if error is not None:
            job._put(error)
        self.completed += 1
        job._put(_DONE)

    def _run_alone(self, job: Job) -> None:
        gen = None
        try:
            gen = job.run()
            for item in gen:
                if job.cancelled.is_set():
                    self.cancelled += 1
                    break
                if self.stopping:
                    job._put(ShuttingDown())
                    break
                job._put(item)
        except BaseException as e:
            job._put(e)
        finally:
            if gen is not None and hasattr(gen, "close"):
                gen.close()
            self.completed += 1
            job._put(_DONE)
