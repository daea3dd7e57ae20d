"""End-to-end on the real default model (Gemma 3 270M). Slow: select with `pytest -m real_model`."""

from __future__ import annotations

import pytest

from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.model import load_model
from turborag.eval.metrics import contains_answer
from turborag.store.kv_store import KVStore

pytestmark = pytest.mark.real_model

PASSAGES = [
    "Veltrano Dynamics is a maker of small river ferries. The company was founded in 1911 by Ismena Throll, "
    "a ship engineer from the coastal town of Quorvik.",
    "The Sallow is a slow river that runs through the town of Brem. Every spring the town holds a lantern "
    "festival on its banks.",
    "Cobalt Orchard is a folk band from Tarsk. The band's first album, Grey Lanterns, came out in 1987.",
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(load_model(), KVStore(tmp_path_factory.mktemp("store")))


@pytest.fixture(scope="module")
def base_engine(tmp_path_factory):
    return Engine(load_model("gemma-3-270m"), KVStore(tmp_path_factory.mktemp("base-store")))


def test_answer_contains_fact_in_full_and_turbo(base_engine):
    """A pipeline check on the base model, not an accuracy claim: without the cache-aware fine-tune turbo
    loses accuracy on many orderings (measured by `turborag eval`, turborag_research/notes/); this ordering
    is one the base model reads right in both modes (with the fact passage in the middle, turbo answers
    "Veltrano Dynamics").  The shipped adapter answers it in full but declines it in turbo ("The passages
    do not say."), one of its false abstentions (turborag_research/notes/2026-12-03-adapter-stages.md)."""
    engine = base_engine
    params = SamplingParams(max_new_tokens=16, stop_at_newline=True)
    for mode in ("full", "turbo"):
        a = engine.answer("Who founded Veltrano Dynamics?", PASSAGES, mode, params)
        assert contains_answer(a.text, ["Ismena Throll"]), (mode, a.text)
    assert a.cached_tokens > 0


def test_one_passage_turbo_equals_full_on_real_model(engine):
    params = SamplingParams(max_new_tokens=12, stop_at_newline=True)
    full = engine.answer("Which band released Grey Lanterns?", PASSAGES[2:], "full", params)
    turbo = engine.answer("Which band released Grey Lanterns?", PASSAGES[2:], "turbo", params)
    assert full.token_ids == turbo.token_ids


def test_default_model_declines_a_name_no_passage_mentions(engine):
    """The shipped adapter records the name check: a near-namesake of a passage's company is declined in
    every mode, and says which name was missing; the real name is not."""
    assert engine.name_check and engine.abstain_threshold is not None
    params = SamplingParams(max_new_tokens=16, stop_at_newline=True)
    for mode in ("full", "turbo"):
        a = engine.answer("Who founded Veltreno Dynamics?", PASSAGES, mode, params)
        assert a.text == "The passages do not say." and a.missing_names == ["Veltreno Dynamics"], mode
        assert engine.answer("Who founded Veltrano Dynamics?", PASSAGES, mode, params).missing_names == []
