"""The RAM tier: LRU under a byte budget, and an engine that answers the same with it as without."""

from __future__ import annotations

import torch

from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.options import EngineOptions
from turborag.store.kv_store import KVStore
from turborag.store.ram_tier import RamTier

PASSAGES = [
    "Veltrano Dynamics was founded in 1911 by Ismena Throll in the city of Quorvik.",
    "The river Sallow runs through Brem, a town known for its blue bridges.",
    "Cobalt Orchard is a band from Tarsk whose first album came out in 1987.",
]


def _pair(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(1, tokens, 4), torch.zeros(1, tokens, 4)  # 16 * tokens bytes each


def test_lru_under_the_budget():
    ram = RamTier(max_bytes=3 * 2 * 16 * 10)  # three entries of one 10-token layer
    for key in "abc":
        ram.put(key, {0: _pair(10)})
    assert ram.get("a", [0]) is not None  # a is now the most recently used
    ram.put("d", {0: _pair(10)})  # evicts b, the least recently used
    assert ram.get("b", [0]) is None and ram.get("a", [0]) is not None and ram.get("d", [0]) is not None
    assert ram.stats.evictions == 1 and ram.stats.entries == 3 and ram.stats.bytes <= ram.max_bytes
    assert ram.stats.hits == 3 and ram.stats.misses == 1


def test_layers_merge_and_a_hit_needs_every_layer():
    ram = RamTier(max_bytes=10_000)
    ram.put("a", {0: _pair(5)})
    assert ram.get("a", [0, 2]) is None  # layer 2 not held: a miss
    ram.put("a", {2: _pair(5)})
    assert set(ram.get("a", [0, 2])) == {0, 2} and ram.stats.bytes == 2 * 2 * 16 * 5


def test_an_entry_larger_than_the_budget_is_not_kept_and_zero_keeps_nothing():
    ram = RamTier(max_bytes=100)
    ram.put("big", {0: _pair(10)})  # 320 bytes
    assert len(ram) == 0 and ram.stats.bytes == 0
    off = RamTier(0)
    off.put("a", {0: _pair(1)})
    assert len(off) == 0


def test_engine_with_a_ram_tier_answers_the_same_and_skips_the_store(gemma_lm, tmp_path):
    params = SamplingParams(max_new_tokens=8)
    plain = Engine(gemma_lm, KVStore(tmp_path / "a", cache_format="float32"))
    plain.stop_ids = set()
    cached = Engine(
        gemma_lm, KVStore(tmp_path / "b", cache_format="float32"), EngineOptions(ram_cache_bytes=50_000_000)
    )
    cached.stop_ids = set()
    for engine in (plain, cached):
        engine.precompute(PASSAGES)
    reference = plain.answer("Who founded Veltrano?", PASSAGES, "turbo", params)
    first = cached.answer("Who founded Veltrano?", PASSAGES, "turbo", params)
    reads = cached.store.hits
    second = cached.answer("Who founded Veltrano?", PASSAGES, "turbo", params)
    assert first.token_ids == second.token_ids == reference.token_ids
    assert cached.store.hits == reads  # every chunk came from RAM
    assert cached.caches.ram.stats.hits >= len(PASSAGES) and cached.caches.ram.stats.entries == len(PASSAGES)


def test_a_budget_smaller_than_a_request_still_answers_right(gemma_lm, tmp_path):
    params = SamplingParams(max_new_tokens=8)
    plain = Engine(gemma_lm, KVStore(tmp_path / "a", cache_format="float32"))
    small = Engine(
        gemma_lm, KVStore(tmp_path / "b", cache_format="float32"), EngineOptions(ram_cache_bytes=40_000)
    )
    for engine in (plain, small):
        engine.stop_ids = set()
        engine.precompute(PASSAGES)
    for _ in range(2):
        a = small.answer("Who founded Veltrano?", PASSAGES, "turbo", params)
        assert a.token_ids == plain.answer("Who founded Veltrano?", PASSAGES, "turbo", params).token_ids
    assert small.caches.ram.stats.bytes <= 40_000 and small.caches.ram.stats.evictions > 0


def test_the_tiers_count_reads_where_they_happen(gemma_lm, tmp_path):
    """A first answer reads every chunk from the store and keeps it in RAM; a second reads none from the
    store; the stats the metrics scrape show both."""
    writer = Engine(gemma_lm, KVStore(tmp_path / "c", cache_format="float32"))  # as another process
    writer.precompute(PASSAGES)
    engine = Engine(
        gemma_lm, KVStore(tmp_path / "c", cache_format="float32"), EngineOptions(ram_cache_bytes=50_000_000)
    )
    engine.answer("Who founded Veltrano?", PASSAGES, "turbo", SamplingParams(max_new_tokens=2))
    first = engine.caches.stats()
    assert first["store"]["hits"] == len(PASSAGES) and first["ram"]["entries"] == len(PASSAGES)
    engine.answer("Who founded Veltrano?", PASSAGES, "turbo", SamplingParams(max_new_tokens=2))
    second = engine.caches.stats()
    assert second["store"] == first["store"]
    assert second["ram"]["hits"] == first["ram"]["hits"] + len(PASSAGES)
    assert engine.caches.read({"no-such-key": [0]}, 1) == {"no-such-key": None}
