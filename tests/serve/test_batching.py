"""Continuous batching in the server: the scheduler's limits (batch width, prefill budget, cancellation) on
fake sequences, and over HTTP on a tiny Gemma 3 that concurrent requests are decoded together and answered
exactly as one at a time, with the batch visible in /metrics."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import torch
from conftest import char_tokenizer, make

from turborag.bench.serve import ServedApp
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.model import LoadedModel, fingerprint
from turborag.core.options import EngineOptions
from turborag.serve import Served, create_app
from turborag.serve.worker import Generation, ModelWorker
from turborag.store.kv_store import KVStore


class FakeSeq:
    """A sequence that emits `n` tokens ("t0", "t1", ...) and then its answer, "done"."""

    def __init__(self, n: int, prompt_tokens: int, log: list):
        self.n, self.prompt_tokens, self.cached_tokens = n, prompt_tokens, 0
        self.i, self.finished, self.log = 0, False, log

    def advance(self) -> list:
        self.i += 1
        self.finished = self.i >= self.n
        return [f"t{self.i}"] + (["done"] if self.finished else [])


def _run_worker(jobs: list[tuple[int, int]], cancel_first: bool = False, **kw) -> tuple[list, list, list]:
    """Submit generations (tokens, prompt tokens) at once to a worker that starts only when all are queued;
    returns each job's items, the batch width of every step and the jobs admitted before each step."""
    widths, admitted, log = [], [], []
    gate = threading.Event()

    def step(rows):
        gate.wait(10)
        widths.append(len(rows))
        admitted.append(len(log))

    async def main():
        worker = ModelWorker(max_queue=64, step=step, **kw)

        def begin_of(n, p):
            def begin():
                gate.wait(10)
                log.append(n)
                return FakeSeq(n, p, log)

            return begin

        submitted = [worker.submit(Generation(begin_of(n, p))) for n, p in jobs]
        if cancel_first:
            submitted[0].cancel()
        gate.set()
        out = []
        for job in submitted:
            out.append([item async for item in job.items()])
        return out

    return asyncio.run(main()), widths, admitted


def test_batch_width_is_bounded_and_every_job_is_answered():
    items, widths, _ = _run_worker([(5, 4)] * 7, max_batch=3)
    assert all(got == [f"t{i}" for i in range(1, 6)] + ["done"] for got in items)
    assert max(widths) == 3 and 1 <= min(widths)


def test_prefill_budget_spreads_admissions_over_iterations():
    """Prompts of 8 tokens with a budget of 10: at most two requests begin before each decode step."""
    _, _, admitted = _run_worker([(6, 8)] * 6, max_batch=8, prefill_budget=10)
    begun_per_step = [b - a for a, b in zip([0, *admitted], admitted)]
    assert max(begun_per_step) <= 2 and admitted[-1] == 6


def test_cancelled_job_is_dropped_before_it_begins():
    items, _, _ = _run_worker([(3, 1), (3, 1)], cancel_first=True, max_batch=2)
    assert items[0] == [] and items[1] == ["t1", "t2", "t3", "done"]


# -- over HTTP ---------------------------------------------------------------------------------------------

PASSAGES = [
    "Ada founded Velt in 1911 on the north bank of the river.",
    "The Sallow runs through Brem, a town of blue bridges and slow barges.",
    "Cobalt Orchard is a band from Tarsk; its first album came out in 1987.",
]


def test_concurrent_requests_are_batched_and_answered_as_alone(tmp_path):
    model, tok = make("gemma3"), char_tokenizer()
    lm = LoadedModel(model, tok, "tiny-gemma3", fingerprint(model, tok), torch.device("cpu"), torch.float32)
    engine = Engine(lm, KVStore(tmp_path / "kv", cache_format="float32"))
    engine.stop_ids = set()  # random weights may pick EOS at once: let every answer run its length
    newline = engine.layout.template == "plain"  # the server stops a base model's answer at a newline
    requests = [
        {"q": f"Question {i}?", "contexts": PASSAGES[: 1 + i % 3], "mode": mode, "n": 6 + 3 * i}
        for i, mode in enumerate(["turbo", "full", "turbo-composite", "turbo", "full", "turbo"])
    ]
    want = [
        engine.answer(r["q"], r["contexts"], r["mode"], SamplingParams(r["n"], stop_at_newline=newline)).text
        for r in requests
    ]
    app = create_app(Served(engine, "tiny-gemma3", default_max_tokens=8), max_batch=4)
    widths: list[int] = []
    step = app.state.worker.step

    def watched(rows):
        widths.append(len(rows))
        step(rows)

    app.state.worker.step = watched
    with ServedApp(app) as srv:

        def ask(r):
            body = {
                "model": "turborag",
                "messages": [{"role": "user", "content": r["q"]}],
                "max_tokens": r["n"],
                "turborag": {"contexts": r["contexts"], "mode": r["mode"]},
            }
            return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120).json()

        with ThreadPoolExecutor(len(requests)) as pool:
            got = list(pool.map(ask, requests))
        metrics = httpx.get(srv.url + "/metrics").text
    assert [g["choices"][0]["message"]["content"] for g in got] == want
    assert max(widths) >= 2  # really decoded together
    assert "turborag_batch_size" in metrics and "turborag_decode_tokens_per_second" in metrics


def test_job_whose_loop_closed_is_cancelled_not_fatal():
    """A job still running when the server's event loop closed (shutdown) is cancelled; the model thread
    does not die of "Event loop is closed"."""
    from turborag.serve.worker import Job

    loop = asyncio.new_event_loop()
    job = Job(run=None, loop=loop)
    loop.close()
    job._put("a token")
    assert job.cancelled.is_set()


def _chunked_run(
    prefills: list[int], budget: int, cancel: int | None = None, decodes: int = 3
) -> tuple[list, list, list]:
    """Generations whose `begin` returns prefill steps (as Engine.begin_steps): job i takes prefills[i]
    forwards of 100 tokens, then decodes `decodes` tokens (the first job 3). Returns each job's items, the
    log of events (prefill forwards and decode steps, in order) and how many forwards each job ran."""
    events, forwards = [], [0] * len(prefills)
    gate = threading.Event()

    def step(rows):
        events.append(("decode", len(rows)))

    async def main():
        worker = ModelWorker(max_queue=64, step=step, max_batch=8, prefill_budget=budget)

        def begin_of(i):
            def steps():
                gate.wait(10)
                for _ in range(prefills[i]):
                    forwards[i] += 1
                    events.append(("prefill", i))
                    yield 100
                return FakeSeq(3 if i == 0 else decodes, 100 * prefills[i], [])

            return steps

        jobs = [worker.submit(Generation(begin_of(i))) for i in range(len(prefills))]
        if cancel is not None:
            jobs[cancel].cancel()
        gate.set()
        out = []
        for job in jobs:
            out.append([item async for item in job.items()])
        return out

    return asyncio.run(main()), events, forwards


def test_a_long_prefill_is_chunked_between_decode_steps():
    """A 10-forward prefill submitted first, a 1-forward one after it, 200 tokens of budget: the short one
    is prefilled after one forward of the long one and decodes from then on, the long one's forwards
    alternate with decode steps, two at most (the budget) between two steps."""
    items, events, forwards = _chunked_run([10, 1], budget=200, decodes=30)
    assert items[0] == ["t1", "t2", "t3", "done"] and len(items[1]) == 31
    assert forwards == [10, 1]
    assert events[:2] == [("prefill", 0), ("prefill", 1)]
    first_decode = next(i for i, e in enumerate(events) if e[0] == "decode")
    assert events[:first_decode].count(("prefill", 0)) <= 3  # then the short one decodes
    run = 0
    for kind, _ in events[first_decode:]:  # forwards between two steps (the short one runs): the budget
        run = run + 1 if kind == "prefill" else 0
        assert run <= 2


def test_a_cancelled_request_is_dropped_between_its_prefill_forwards():
    _, _, forwards = _chunked_run([50, 1], budget=100, cancel=0)
    assert forwards[0] == 0  # cancelled before its first forward: none run
    items, _, forwards = _chunked_run([3], budget=100)
    assert forwards == [3] and items[0][-1] == "done"


def test_a_short_request_waits_one_forward_behind_a_long_full_prefill(tmp_path):
    """On a tiny Gemma 3 with 16-token prefill forwards and a 16-token budget: a `full` request over many
    passages is queued first, a turbo request right after. The short one's whole prefill (its question) runs
    after at most one of the long one's forwards, and both answers are those of each request alone."""
    model = make("gemma3")
    tok = char_tokenizer()
    lm = LoadedModel(model, tok, "tiny", fingerprint(model, tok), torch.device("cpu"), torch.float32)
    engine = Engine(lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(prefill_step=16))
    long_passages = [f"Passage {i} tells of the harbour town of Velmora and its boats." for i in range(6)]
    short = ("Who?", ["Odrun Pask rings the bell."])
    params = SamplingParams(max_new_tokens=4, stop_at_newline=False)
    engine.precompute(short[1])
    alone = [
        engine.answer("What is Velmora?", long_passages, "full", params).token_ids,
        engine.answer(*short, "turbo", params).token_ids,
    ]
    forwards: list[tuple[str, int]] = []  # (request, tokens) of each prefill forward, in order

    def tagged(tag, steps):
        def begin():
            while True:
                try:
                    n = next(steps)
                except StopIteration as done:
                    return done.value
                forwards.append((tag, n))
                yield n

        return begin

    async def main():
        worker = ModelWorker(
            max_queue=8, step=lambda rows: [engine.step(r) for r in rows], max_batch=8, prefill_budget=16
        )
        jobs = [
            worker.submit(
                Generation(
                    tagged("long", engine.begin_steps("What is Velmora?", long_passages, "full", params))
                )
            ),
            worker.submit(Generation(tagged("short", engine.begin_steps(*short, "turbo", params)))),
        ]
        out = []
        for job in jobs:
            items = [item async for item in job.items()]
            out.append(items[-1].token_ids)
        return out

    answers = asyncio.run(main())
    assert answers == alone
    order = [tag for tag, _ in forwards if tag in ("long", "short")]
    assert order.count("long") > 4  # the long prompt took several forwards
    assert order.index("short") <= 1  # the short one's prefill ran after at most one of them


def test_over_http_a_short_request_is_not_held_behind_a_long_full_prefill(tmp_path):
    """Through the server on loopback: a `full` request over many passages, prefilled in 16-token forwards
    (slowed to 20 ms each so that it is still prefilling when the next request comes), and a short turbo
    request sent while it runs: the short one's prefill runs after at most one more of the long one's
    forwards, and it is answered before the long one."""
    import time as _time

    model, tok = make("gemma3"), char_tokenizer()
    lm = LoadedModel(model, tok, "tiny-gemma3", fingerprint(model, tok), torch.device("cpu"), torch.float32)
    engine = Engine(lm, KVStore(tmp_path / "kv", cache_format="float32"))
    events: list[str] = []
    begin_steps = engine.begin_steps

    def logged(question, passages, mode, params, *args, **kwargs):
        tag = "long" if mode == "full" else "short"
        steps, sent = begin_steps(question, passages, mode, params, *args, **kwargs), None
        while True:
            try:
                step = steps.send(sent)
            except StopIteration as done:
                events.append(f"{tag}-done")
                return done.value
            events.append(tag)
            if tag == "long":
                _time.sleep(0.02)
            sent = yield step  # a deferred forward's logits, from the worker

    engine.begin_steps = logged
    backend = Served(engine, "tiny-gemma3", default_max_tokens=4)
    app = create_app(backend, max_batch=4, prefill_budget=16)  # forwards of 16: the chunk is capped by it
    long_passages = [f"Passage {i} tells of the harbour town of Velmora and its boats." for i in range(6)]

    def ask(srv, question, contexts, mode):
        body = {
            "model": "turborag",
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 2,
            "turborag": {"contexts": contexts, "mode": mode},
        }
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
        events.append(f"{mode}-answered")
        return r.status_code

    with ServedApp(app) as srv, ThreadPoolExecutor(2) as pool:
        long = pool.submit(ask, srv, "What is Velmora?", long_passages, "full")
        deadline = _time.monotonic() + 60
        while events.count("long") < 3:  # the long prefill is under way
            assert _time.monotonic() < deadline, events
            _time.sleep(0.005)
        short = pool.submit(ask, srv, "Who?", ["Odrun Pask rings the bell."], "turbo")
        assert long.result() == 200 and short.result() == 200
    first_short = events.index("short")
    assert events[first_short:].count("long") >= 5  # it did not wait for the long prefill to end
    assert events.index("short-done") < events.index("long-done")
    assert events.index("turbo-answered") < events.index("full-answered")


def _gemma_engine(tmp_path, **kw) -> Engine:
    model, tok = make("gemma3"), char_tokenizer()
    lm = LoadedModel(model, tok, "tiny-gemma3", fingerprint(model, tok), torch.device("cpu"), torch.float32)
    engine = Engine(lm, KVStore(tmp_path / "kv", cache_format="float32"), EngineOptions(**kw))
    engine.stop_ids = set()
    return engine


def _run_batched(engine: Engine, asks, params, spent: list[int] | None = None, **worker_kw):
    """`asks` ((question, passages, mode) each) queued at once on a worker set up as the server's (batched
    decode and batched prefill, deferred forwards); returns each answer's token ids and the worker. With
    `spent`, each iteration's prefilled tokens are appended to it."""
    import functools

    from turborag.core.batch import DecodeBatch
    from turborag.core.feeds import feed_together

    gate = threading.Event()

    async def main():
        batch = DecodeBatch(engine.lm.model, engine.windows)
        worker = ModelWorker(
            max_queue=8,
            step=batch.step,
            max_batch=8,
            on_idle=batch.clear,
            feed_together=functools.partial(feed_together, windows=engine.windows),
            **worker_kw,
        )
        if spent is not None:
            prefill = worker._prefill
            worker._prefill = lambda *a: spent.append(prefill(*a)) or spent[-1]  # each iteration's tokens

        def begin_of(q, p, m):
            def begin():
                gate.wait(10)
                return (yield from engine.begin_steps(q, p, m, params, defer=True))

            return begin

        jobs = [worker.submit(Generation(begin_of(*ask))) for ask in asks]
        gate.set()
        out = []
        for job in jobs:
            items = [item async for item in job.items()]
            out.append(items[-1].token_ids)
        return out, worker

    return asyncio.run(main())


def test_questions_admitted_together_share_one_prefill_forward(tmp_path):
    """Four turbo requests queued at once on a worker with batched prefill (the server's setup): their
    questions are prefilled in one forward, and every answer is the one it gets alone."""
    engine = _gemma_engine(tmp_path)
    params = SamplingParams(max_new_tokens=6)
    boats = "The harbour of Velmora has boats. "
    asks = [
        (f"Who rings bell {i}?", [f"Odrun Pask rings bell {i}.", boats * (i + 1)], "turbo") for i in range(4)
    ]
    alone = [engine.answer(q, p, m, params).token_ids for q, p, m in asks]
    answers, worker = _run_batched(engine, asks, params)
    assert answers == alone
    assert worker.prefill_feeds == 4 and worker.prefill_forwards == 1


def test_no_iteration_prefills_more_than_the_budget(tmp_path):
    """A `full` request over long passages and four turbo questions queued together, forwards of at most 16
    tokens, a budget of 40 tokens an iteration: the worker never starts a forward that would take the
    iteration past the budget (padding of a batched forward counted), and every answer is as alone."""
    engine = _gemma_engine(tmp_path, prefill_step=16)
    params = SamplingParams(max_new_tokens=4)
    long_passages = [f"Passage {i} tells of the harbour town of Velmora and its boats." for i in range(4)]
    asks = [("What is Velmora?", long_passages, "full")]
    asks += [(f"Who rings bell {i}?", [f"Odrun Pask rings bell {i}."], "turbo") for i in range(4)]
    alone = [engine.answer(q, p, m, params).token_ids for q, p, m in asks]
    spent: list[int] = []
    answers, worker = _run_batched(engine, asks, params, spent, prefill_budget=40)
    assert answers == alone
    assert max(spent) <= 40 and worker.longest_prefill_tokens == max(spent), spent
    assert sum(spent) >= 5 * 16  # the full prompt alone is over 200 tokens: the work was spread out
