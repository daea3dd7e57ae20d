"""`turborag bench store`: turbo TTFT at one context size from each storage tier and cache format, in one run.

The same question over the same ~8k-token context (CPython's docs, as `bench ttft`) is answered in turbo mode
with its chunk caches read from: the RAM tier (a hit: no read, no hash check, no cast), local files (usually
in the OS page cache, as on a warm server), a Redis server and a Redis Cluster (when their URLs are given),
for each cache format (16-bit, int8, fp8). Every store is filled first (untimed), then each combination is
measured `repeats` times in rotation, so machine noise hits all alike; the median is reported with the
bytes stored per context token.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from turborag.bench.engine import QUESTION, doc_chunks
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.store.kv_store import KVStore, cache_key
from turborag.store.tiered import TieredStore
from turborag.store.urls import open_backend


@dataclass
class StoreRow:
    tier: str  # ram, file, redis, redis-cluster
    format: str  # the store dtype: bfloat16 / float16, int8, fp8
    ttft_s: float  # median
    bytes_per_token: float  # stored bytes (blobs, headers included) per context token


def bench_store(
    engine: Engine,
    root: Path,
    formats: list[str],
    redis_url: str | None = None,
    cluster_url: str | None = None,
    context_tokens: int = 8192,
    repeats: int = 5,
    log=print,
) -> list[StoreRow]:
    """TTFT of turbo from every (tier, format); `engine`'s tiered store is swapped per combination."""
    chunks = doc_chunks(engine, context_tokens)
    backends = {"file": lambda fmt: open_backend(root / fmt)}
    if redis_url:
        backends["redis"] = lambda fmt: open_backend(_with_prefix(redis_url, fmt))
    if cluster_url:
        backends["redis-cluster"] = lambda fmt: open_backend(_with_prefix(cluster_url, fmt))
    dev, dtype = engine.lm.device, engine.lm.dtype
    setups = []  # (tier, format, tiered store)
    for fmt in formats:
        for tier, make in backends.items():
            setups.append((tier, fmt, TieredStore(KVStore(make(fmt), fmt), 0, dev, dtype)))
        setups.append(("ram", fmt, TieredStore(setups[-len(backends)][2].store, 8 << 30, dev, dtype)))
    one = SamplingParams(max_new_tokens=1)
    for tier, fmt, caches in setups:  # fill every store (and RAM tier), untimed
        engine.caches = caches
        engine.precompute(chunks)
        engine.answer(QUESTION, chunks, "turbo", one)
        log(f"filled {tier} ({fmt})")
    times: dict[int, list[float]] = {i: [] for i in range(len(setups))}
    for _ in range(repeats):
        for i, (_, _, caches) in enumerate(setups):
            engine.caches = caches
            answer = engine.answer(QUESTION, chunks, "turbo", one)
            assert answer.computed_chunks == 0, "a cache went missing during the benchmark"
            times[i].append(answer.ttft_s)
    ids = [engine.layout.chunk_ids(c) for c in chunks]
    tokens = sum(len(c) for c in ids)
    rows = []
    for i, (tier, fmt, caches) in enumerate(setups):
        keys = [
            cache_key(engine.lm.fingerprint, engine.prefix_ids, c, caches.store.cache_format) for c in ids
        ]
        stored = sum(caches.store.size(k) or 0 for k in keys)
        rows.append(StoreRow(tier, fmt, statistics.median(times[i]), stored / tokens))
    return rows


def _with_prefix(url: str, fmt: str) -> str:
    """Each format under its own key prefix, so that the benchmark's stores never mix."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}prefix=turborag-bench:{fmt}:"


def rows_as_dicts(rows: list[StoreRow]) -> list[dict]:
    return [asdict(r) for r in rows]
