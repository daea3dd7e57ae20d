"""Where one turbo request's TTFT goes: prompt and keys, read, assembly, question prefill, first token.

    python scripts/profile_turbo.py [--context-tokens 8192] [--model gemma-3-270m-turbo] [--dtype auto]

Uses the `bench ttft` store ($TURBORAG_HOME/bench-store; the chunks are computed first if missing) and the
same question and chunks as `bench ttft`. Each phase is timed on its own, in the order a request runs them,
median of --repeats. How the caches are read is the engine's (TieredStore.read): where the store keeps them
in the compute dtype (bf16), "read" only opens the files and checks their headers, and "assemble" reads
each tensor straight into the serving buffers, checks its hash and rotates the keys; otherwise "read" reads
and checks the tensors and "assemble" rotates and copies them. "verify" is the xxh3 of the tensors a
request needs, timed in a separate loop over copies of them (one of the two phases above includes it).
The question prefill scores the abstention reply in the same forward when the model has a threshold, as
a request does. Then the floor's distance from the compute limit: the prefill's FLOPs against this CPU's
matmul rate, and its weight bytes against the memory read rate. Prints a table and, with --json, one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import xxhash

from turborag.bench.engine import QUESTION, bench_context
from turborag.core import kv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context-tokens", type=int, default=8192)
    ap.add_argument("--model", default="gemma-3-270m-turbo")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    engine, chunks = bench_context(args.model, args.dtype, args.context_tokens)
    prompt = engine.layout.build(QUESTION, chunks)
    lengths = [len(c) for c in prompt.chunks]
    keys = [engine.key(c) for c in prompt.chunks]
    wanted = kv.needed_layers(lengths, len(prompt.prefix), engine.windows)
    reserve = len(prompt.suffix) + len(engine.scored_reply) + 8
    needed = dict(zip(keys, wanted))
    names = ("prompt + keys", "read", "assemble", "question prefill", "first token", "total")
    phases: dict[str, list[float]] = {p: [] for p in (*names, "verify")}
    for _ in range(args.repeats + 1):
        tp = time.perf_counter()
        prompt = engine.layout.build(QUESTION, chunks)  # the chunks' token ids and keys, as a request's
        keys = [engine.key(c) for c in prompt.chunks]
        t0 = time.perf_counter()
        found = engine.caches.read(needed, len(engine.windows))
        t1 = time.perf_counter()
        cache, next_pos = assemble(engine, [found[k] for k in keys], lengths, reserve)
        t2 = time.perf_counter()
        logits = engine.prefill_question(cache, prompt, next_pos, scored=True)  # as turbo: bench ttft's floor
        t3 = time.perf_counter()
        int(logits.argmax())
        t4 = time.perf_counter()
        for name, s in zip(names, (t0 - tp, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - tp)):
            phases[name].append(s)
    # The hash alone, over the same bytes, in its own loop: inside the request loop its extra pass over
    # the data would evict caches and slow the phases after it.
    loaded = [engine.store.get_layers(k, w) for k, w in zip(keys, wanted)]
    for _ in range(args.repeats + 1):
        tv = time.perf_counter()
        for layers in loaded:
            for pair in layers:
                for t in pair or ():
                    xxhash.xxh3_64_hexdigest(t.reshape(-1).view(torch.uint8).numpy())
        phases["verify"].append(time.perf_counter() - tv)
    out = {name: statistics.median(v[1:]) for name, v in phases.items()}  # the first round warms up
    limit = compute_limit(engine, prompt, loaded, lengths, reserve, out["question prefill"])
    read_bytes = sum(t.numel() * t.element_size() for layers in loaded for pair in layers for t in pair or ())
    info = {
        "model": args.model,
        "dtype": str(engine.lm.dtype).removeprefix("torch."),
        "context_tokens": sum(lengths),
        "chunks": len(lengths),
        "bytes_read": read_bytes,
        "read_in_place": engine.caches.in_place,
        "phases_s": out,
        "compute_limit": limit,
    }
    if args.json:
        print(json.dumps(info))
        return
    print(
        f"{args.model} {info['dtype']}, {info['context_tokens']} context tokens in {len(lengths)} chunks, "
        f"{read_bytes / 1e6:.1f} MB read{' in place' if engine.caches.in_place else ''}; "
        f"median of {args.repeats}"
    )
    for name, s in out.items():
        print(f"  {name:18s} {s * 1000:8.1f} ms")
    weights_ms = limit["weight_bytes"] / 1e9 / limit["memory_gbs"] * 1000
    print(
        f"question prefill: {limit['gflop']:.2f} GFLOP at {limit['achieved_gflops']:.1f} GFLOP/s, "
        f"{limit['achieved_gflops'] / limit['matmul_gflops']:.0%} of this CPU's {limit['matmul_gflops']:.0f} "
        f"GFLOP/s ({info['dtype']} matmul; {limit['attention_gflop']:.2f} GFLOP of it attention): "
        f"{limit['compute_bound_s'] * 1000:.1f} ms if compute-bound; it reads "
        f"{limit['weight_bytes'] / 1e6:.0f} MB of weights, {weights_ms:.1f}"
        f" ms at this machine's {limit['memory_gbs']:.1f} GB/s memory read rate"
    )


def assemble(engine, loaded, lengths: list[int], reserve: int):
    """The turbo context from the layers read, as a request assembles it (reordered positions)."""
    lm = engine.lm
    return kv.assemble_into(
        engine.prefix_kv,
        loaded,
        engine.inv_freq,
        "reordered",
        lm.device,
        lm.dtype,
        reserve,
        engine.windows,
        lengths,
    )


def matmul_gflops(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """This CPU's dense matmul rate in `dtype` (n x n by n x n, median of `repeats`)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # warm up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times) / 1e9


def attention_flops(config, windows: list[int | None], queries: int, keys: int) -> int:
    """QK^T and AV of `queries` new tokens over `keys` positions (a sliding layer: its window), every layer.
    Counted here because FlopCounterMode does not count torch's CPU attention kernel."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return sum(4 * heads * head_dim * queries * min(keys, w or keys) for w in windows)


def read_gbs(mib: int = 512, repeats: int = 5) -> float:
    """This machine's memory read rate (a sum over `mib` MiB of fp32), GB/s, median of `repeats`."""
    t = torch.ones(mib * 2**18)
    t.sum()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        t.sum()
        times.append(time.perf_counter() - t0)
    return t.numel() * 4 / statistics.median(times) / 1e9


def compute_limit(engine, prompt, loaded, lengths, reserve, prefill_s: float) -> dict:
    """The floor's distance from the compute limit: the question prefill's FLOPs (counted by torch's
    FlopCounterMode: the matmuls and attention of one forward over a freshly assembled cache) against this
    CPU's matmul rate, and the weight bytes that forward reads."""
    from torch.utils.flop_counter import FlopCounterMode

    lm = engine.lm
    cache, next_pos = assemble(engine, loaded, lengths, reserve)
    with FlopCounterMode(display=False) as counter:
        engine.prefill_question(cache, prompt, next_pos, scored=True)
    q = len(prompt.suffix) + len(engine.scored_reply)
    attention = attention_flops(lm.config, engine.windows, q, next_pos + q)
    flops = counter.get_total_flops() + attention
    rate = matmul_gflops(lm.dtype)
    weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    return {
        "gflop": flops / 1e9,
        "attention_gflop": attention / 1e9,
        "memory_gbs": read_gbs(),
        "achieved_gflops": flops / 1e9 / prefill_s,
        "matmul_gflops": rate,
        "compute_bound_s": flops / 1e9 / rate,
        "weight_bytes": weights,
        "tokens": q,  # the question's, and the abstention reply's when it is scored
    }


if __name__ == "__main__":
    main()
