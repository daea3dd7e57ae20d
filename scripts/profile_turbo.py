"""Where one turbo request's TTFT goes: read, verify, rotate/copy, question prefill, first token.

    python scripts/profile_turbo.py [--context-tokens 8192] [--model gemma-3-270m-turbo] [--dtype auto]

Uses the `bench ttft` store ($TURBORAG_HOME/bench-store; the chunks are computed first if missing) and the
same question and chunks as `bench ttft`. Each phase is timed on its own, in the order a request runs them,
median of --repeats; "verify" is the xxh3 of the tensors read, timed in a separate loop over the same
bytes (the read includes it). Prints a table and, with --json, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import xxhash

from turborag.bench.engine import QUESTION, doc_chunks
from turborag.core import kv
from turborag.core.engine import Engine
from turborag.core.model import cache_dtype_for, load_model, turborag_home
from turborag.store.kv_store import KVStore


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context-tokens", type=int, default=8192)
    ap.add_argument("--model", default="gemma-3-270m-turbo")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    lm = load_model(args.model, "cpu", args.dtype)
    engine = Engine(lm, KVStore(turborag_home() / "bench-store", cache_dtype_for(lm.dtype)))
    chunks = doc_chunks(engine, args.context_tokens, 512)
    engine.precompute(chunks)
    prompt = engine.layout.build(QUESTION, chunks)
    lengths = [len(c) for c in prompt.chunks]
    keys = [engine.key(c) for c in prompt.chunks]
    wanted = kv.needed_layers(lengths, len(prompt.prefix), engine.windows)
    reserve = len(prompt.suffix) + 8
    phases: dict[str, list[float]] = {
        p: []
        for p in ("read + verify", "verify", "rotate + copy", "question prefill", "first token", "total")
    }
    for _ in range(args.repeats + 1):
        t0 = time.perf_counter()
        loaded = [engine.store.get_layers(k, w) for k, w in zip(keys, wanted)]
        t1 = time.perf_counter()
        cache, next_pos = kv.assemble_into(
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
        t2 = time.perf_counter()
        logits = engine.prefill_question(cache, prompt, next_pos)
        t3 = time.perf_counter()
        int(logits.argmax())
        t4 = time.perf_counter()
        for name, s in zip(
            ("read + verify", "rotate + copy", "question prefill", "first token", "total"),
            (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0),
        ):
            phases[name].append(s)
    # The hash alone, over the same bytes, in its own loop: inside the request loop its extra pass over
    # the data would evict caches and slow the phases after it.
    for _ in range(args.repeats + 1):
        tv = time.perf_counter()
        for layers in loaded:
            for pair in layers:
                for t in pair or ():
                    xxhash.xxh3_64_hexdigest(t.reshape(-1).view(torch.uint8).numpy())
        phases["verify"].append(time.perf_counter() - tv)
    out = {name: statistics.median(v[1:]) for name, v in phases.items()}  # the first round warms up
    read_bytes = sum(t.numel() * t.element_size() for layers in loaded for pair in layers for t in pair or ())
    info = {
        "model": args.model,
        "dtype": str(lm.dtype).removeprefix("torch."),
        "context_tokens": sum(lengths),
        "chunks": len(lengths),
        "bytes_read": read_bytes,
        "phases_s": out,
    }
    if args.json:
        print(json.dumps(info))
        return
    print(
        f"{args.model} {info['dtype']}, {info['context_tokens']} context tokens in {len(lengths)} chunks, "
        f"{read_bytes / 1e6:.1f} MB read; median of {args.repeats}"
    )
    for name, s in out.items():
        print(f"  {name:18s} {s * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
