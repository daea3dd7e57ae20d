"""EngineOptions: how an engine answers, given when it is built; with_options makes a variant that shares the
model and the caches, and nothing else about the engine changes."""

from __future__ import annotations

import pytest

from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.options import EngineOptions
from turborag.store.kv_store import KVStore

PASSAGES = ["Veltrano Dynamics was founded in 1911 by Ismena Throll.", "The river Sallow runs through Brem."]


@pytest.mark.parametrize(
    "bad",
    [
        {"template": "fancy"},
        {"abstain_threshold": 1.5},
        {"recompute_k": -1},
        {"recompute_ratio": 2.0},
        {"ape_scale": 0.0},
        {"prefill_step": 0},
        {"ram_cache_bytes": -1},
    ],
)
def test_bad_options_are_refused_when_made(bad):
    with pytest.raises(ValueError):
        EngineOptions(**bad)


def test_none_means_as_the_model_records_and_zero_turns_the_threshold_off(gemma_lm, tmp_path, monkeypatch):
    monkeypatch.setattr(gemma_lm, "abstain_threshold", 0.35)
    monkeypatch.setattr(gemma_lm, "name_check", True)
    store = KVStore(tmp_path, cache_format="float32")
    recorded = Engine(gemma_lm, store)
    assert (recorded.abstain_threshold, recorded.name_check) == (0.35, True)
    off = Engine(gemma_lm, store, EngineOptions(abstain_threshold=0, name_check=False))
    assert (off.abstain_threshold, off.name_check) == (None, False)
    assert Engine(gemma_lm, store, EngineOptions(abstain_threshold=0.5)).abstain_threshold == 0.5


def test_a_variant_shares_model_and_caches_and_leaves_the_engine_as_it_was(gemma_lm, tmp_path):
    engine = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(ram_cache_bytes=10**8))
    variant = engine.with_options(recompute_k=4, abstain_threshold=1.0)
    assert variant.caches is engine.caches and variant.prefix_kv is engine.prefix_kv
    assert (variant.training_free.recompute_k, variant.abstain_threshold) == (4, 1.0)
    assert (engine.training_free.recompute_k, engine.abstain_threshold) == (16, gemma_lm.abstain_threshold)
    engine.precompute(PASSAGES)
    one = SamplingParams(max_new_tokens=1)
    assert variant.answer("Who founded Veltrano?", PASSAGES, "turbo", one).abstain_logprob is not None
    assert engine.caches.ram.stats.hits >= len(PASSAGES)  # the variant read the engine's RAM tier
    with pytest.raises(ValueError, match="ram_cache_bytes"):
        engine.with_options(ram_cache_bytes=0)
