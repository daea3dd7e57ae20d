"""`turborag bench serve`: the HTTP server under load, and prompt caching on an agent-style conversation.

Both run a real server (uvicorn, in this process) on a free loopback port and talk to it over HTTP with the
official `openai` client; every loop is bounded in count and time.

- load: `clients` concurrent streaming chat requests (each with `turborag.contexts`, so the same passages
  and caches are used by all), `rounds` requests per client, run twice in one go: with `max_batch = 1`
  (one request decoded at a time) and with the server's continuous batching. Reports requests/s, generated
  tokens/s, TTFT p50/p99 as the client sees it (request sent -> first content chunk), inter-token latency
  p50/p99 (the gaps between content chunks of one stream), errors, and the queue depth afterwards.
- sweep: the turbo-only load again with fewer clients (1, 4, 16 by default), both ways, for TTFT against
  the number of concurrent clients (`sweep_row` keeps what the plot shows).
- agent: a `steps`-step conversation whose system prompt has `system_tokens` tokens, sent through
  `/v1/chat/completions` with `turborag.retrieve = false` (a plain prompt). Each step appends the previous
  answer and a new user turn. Measured twice, with prompt caching on and off (a server whose prefix cache
  holds nothing), TTFT per step side by side.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from turborag.bench.engine import doc_text
from turborag.core.defaults import DEFAULT_MAX_BATCH, DEFAULT_PREFILL_BUDGET
from turborag.serve import Served, create_app


class ServedApp:
    """uvicorn in a thread on a free loopback port."""

    def __init__(self, app):
        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, timeout: float = 600):
        import openai

        return openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1", api_key="bench", max_retries=0, timeout=timeout
        )


def _stream_ttft(client, gaps: list[float] | None = None, **kw) -> tuple[float, int, int]:
    """(seconds to the first content chunk, completion tokens, cached tokens) of one streamed request; the
    seconds between its consecutive content chunks are appended to `gaps` (inter-token latency)."""
    t0 = time.perf_counter()
    first, usage, last = None, None, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.choices and chunk.choices[0].delta.content:
            now = time.perf_counter()
            if first is None:
                first = now - t0
            elif gaps is not None:
                gaps.append(now - last)
            last = now
        usage = chunk.usage or usage
    total = time.perf_counter() - t0
    return (
        (first if first is not None else total),
        usage.completion_tokens,
        usage.prompt_tokens_details.cached_tokens,
    )


def _percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of values, None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_load(
    served: Served,
    clients: int = 32,
    rounds: int = 2,
    max_tokens: int = 64,
    passages: int = 5,
    max_batch: int = DEFAULT_MAX_BATCH,
    min_tokens: int = 0,
    full_share: float = 0.0,
    max_batch_tokens: int = DEFAULT_PREFILL_BUDGET,
) -> dict:
    """`clients` threads each stream `rounds` chat requests at a server decoding up to `max_batch` at once;
    with `min_tokens`, no answer ends before that many tokens (vLLM's request field of that name). With
    `full_share`, that share of the requests (every n-th) asks for `full` mode, a prefill of every passage,
    the others `turbo`; TTFT is reported for each mode apart, and the server's heaviest iteration."""
    every = round(1 / full_share) if full_share > 0 else 0
    text = doc_text()
    contexts = [text[i * 600 : (i + 1) * 600] for i in range(passages)]
    app = create_app(
        served, max_queue=max(64, clients * 2), max_batch=max_batch, prefill_budget=max_batch_tokens
    )
    gaps: list[float] = []
    with ServedApp(app) as srv:
        client = srv.client()
        served.engine.precompute(contexts)  # offline step, as ingest would do
        _stream_ttft(
            client,
            model="turborag",
            messages=[{"role": "user", "content": "warm up"}],
            max_tokens=1,
            extra_body={"turborag": {"contexts": contexts}},
        )

        def one(i: int):
            out = []
            for r in range(rounds):
                msg = [{"role": "user", "content": f"Question {i}.{r}: what does the assert statement do?"}]
                mode = "full" if every and (i * rounds + r) % every == 0 else "turbo"
                body = {"turborag": {"contexts": contexts, "mode": mode}, "min_tokens": min_tokens}
                try:
                    got = _stream_ttft(
                        client,
                        gaps,
                        model="turborag",
                        messages=msg,
                        max_tokens=max_tokens,
                        extra_body=body,
                    )
                    out.append((*got, mode))
                except Exception as e:  # counted, not raised: the bench reports errors
                    out.append(e)
            return out

        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            results = [x for chunk in pool.map(one, range(clients)) for x in chunk]
        wall = time.perf_counter() - t0
        summary = _load_summary(results, wall, gaps, app.state.worker)  # the server still up
    settings = {
        "clients": clients,
        "max_batch": max_batch,
        "max_batch_tokens": max_batch_tokens,
        "max_tokens": max_tokens,
        "min_tokens": min_tokens,
    }
    return {**settings, **summary, "full_share": full_share}


def _load_summary(results: list, wall: float, gaps: list[float], worker) -> dict:
    """Requests/s, tokens/s, TTFT (all, turbo and full apart) and inter-token latency percentiles of one
    load run, and what the server's worker saw (its heaviest iteration, prefill feeds per forward)."""
    ok = [r for r in results if not isinstance(r, Exception)]  # (ttft, tokens, ..., mode)
    ttfts = sorted(r[0] for r in ok)
    per_mode = {m: [r[0] for r in ok if r[3] == m] for m in ("turbo", "full")}
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "seconds": wall,
        "requests_per_s": len(ok) / wall,
        "tokens_per_s": sum(r[1] for r in ok) / wall,
        "ttft_p50_s": _percentile(ttfts, 0.5),
        "ttft_p99_s": _percentile(ttfts, 0.99),
        "turbo_ttft_p50_s": _percentile(per_mode["turbo"], 0.5),
        "turbo_ttft_p99_s": _percentile(per_mode["turbo"], 0.99),
        "full_ttft_p50_s": _percentile(per_mode["full"], 0.5),
        "full_ttft_p99_s": _percentile(per_mode["full"], 0.99),
        "longest_prefill_tokens": worker.longest_prefill_tokens,
        "longest_iteration_s": worker.longest_iteration_s,
        "prefill_feeds_per_forward": worker.prefill_feeds / max(1, worker.prefill_forwards),
        "itl_p50_s": _percentile(gaps, 0.5),
        "itl_p99_s": _percentile(gaps, 0.99),
        "queue_depth_after": worker.depth,
    }


def sweep_row(run: dict) -> dict:
    """The part of a `bench_load` result that the TTFT-against-concurrency table and plot show."""
    keys = ("clients", "max_batch", "requests", "errors", "requests_per_s", "ttft_p50_s", "ttft_p99_s")
    return {k: run[k] for k in keys}


def bench_agent(served: Served, steps: int = 10, system_tokens: int = 1000, max_tokens: int = 8) -> dict:
    tok = served.engine.lm.tokenizer
    ids = tok(doc_text(), add_special_tokens=False)["input_ids"][:system_tokens]
    system = "You are a Python expert agent. Reference manual:\n" + tok.decode(ids)
    rows = []
    for reuse in (True, False):
        engine = served.engine
        saved = engine.prefix_cache.max_blocks
        engine.prefix_cache.clear()
        engine.prefix_cache.max_blocks = saved if reuse else 0  # 0 = nothing is kept: every step from scratch
        try:
            with ServedApp(create_app(served)) as srv:
                client = srv.client()
                msgs = [{"role": "system", "content": system}]
                for step in range(steps):
                    msgs.append({"role": "user", "content": f"Step {step + 1}: what should I check next?"})
                    ttft, _n, cached = _stream_ttft(
                        client,
                        model="turborag",
                        messages=msgs,
                        max_tokens=max_tokens,
                        extra_body={"turborag": {"retrieve": False}},
                    )
                    msgs.append({"role": "assistant", "content": f"Checked item {step + 1}."})
                    rows.append({"reuse": reuse, "step": step + 1, "ttft_s": ttft, "cached_tokens": cached})
        finally:
            engine.prefix_cache.max_blocks = saved
            engine.prefix_cache.clear()
    return {"steps": steps, "system_tokens": system_tokens, "rows": rows}
