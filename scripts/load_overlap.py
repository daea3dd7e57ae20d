"""Can loading the chunk caches hide behind the question's forward? Loading in a thread, measured.

    python scripts/load_overlap.py [--context-tokens 2048,8192] [--repeats 12] [--threads 2]

A layer-pipelined turbo request would load layer i+1's caches while the model runs layer i. Before building
that, this measures its best case: the floor's question forward on an assembled context (main thread) while
a second thread assembles the same context from the store (`engine.assemble`: read, verify, rotate, copy),
against each alone. If the two overlapped perfectly, "concurrent" would be the larger of "floor" and "load";
if they merely shared the cores, it would be their sum. Each measurement follows a sweep over 600 MB, so the
caches come from memory, as after any forward; medians of --repeats. --threads sets torch's intra-op threads
(the forward's).

Uses the `bench ttft` store ($TURBORAG_HOME/bench-store; chunks are computed first if missing).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from turborag.bench.engine import QUESTION, doc_chunks
from turborag.core.engine import Engine
from turborag.core.model import cache_format_for, load_model, turborag_home
from turborag.core.options import EngineOptions
from turborag.store.kv_store import KVStore


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context-tokens", default="2048,8192")
    ap.add_argument("--model", default="gemma-3-270m-turbo")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    lm = load_model(args.model, "cpu", args.dtype)
    store = KVStore(turborag_home() / "bench-store", cache_format_for(lm.dtype))
    engine = Engine(lm, store, EngineOptions(ram_cache_bytes=0))
    sweep = torch.ones(150_000_000)  # 600 MB: more than any CPU cache
    for size in (int(s) for s in args.context_tokens.split(",")):
        f, ld, c = measure(engine, size, args.repeats, sweep)
        print(
            f"{size} context tokens, {args.threads} threads: floor {f:.1f} ms, load {ld:.1f} ms, "
            f"sum {f + ld:.1f} ms, concurrent {c:.1f} ms",
            flush=True,
        )


def measure(engine: Engine, size: int, repeats: int, sweep: torch.Tensor) -> tuple[float, float, float]:
    """Medians in ms of (floor, load, both at once) for a context of `size` tokens."""
    chunks = doc_chunks(engine, size, 512)
    engine.precompute(chunks)
    prompt = engine.layout.build(QUESTION, list(chunks))
    reserve = len(prompt.suffix) + len(engine.scored_reply) + 8

    def load() -> None:
        engine.assemble(prompt, "turbo", reserve)

    def forward(cache, next_pos) -> None:
        int(engine.prefill_question(cache, prompt, next_pos, scored=True).argmax())

    floor, loading, both = [], [], []
    for _ in range(repeats):
        ctx = engine.assemble(prompt, "turbo", reserve)
        cache, next_pos = ctx.cache, ctx.next_pos
        sweep.sum()
        t = time.perf_counter()
        forward(cache, next_pos)
        floor.append(time.perf_counter() - t)
        sweep.sum()
        t = time.perf_counter()
        load()
        loading.append(time.perf_counter() - t)
        sweep.sum()
        loader = threading.Thread(target=load)
        t = time.perf_counter()
        loader.start()
        forward(cache, next_pos)
        loader.join()
        both.append(time.perf_counter() - t)
    f, ld, c = (statistics.median(x) * 1000 for x in (floor, loading, both))
    return f, ld, c


if __name__ == "__main__":
    main()
