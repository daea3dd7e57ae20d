"""One table of modes (core/modes.py): the engine dispatches on it, and the server, the plots and the
commands take exactly its names."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from turborag.bench.plots import MODE_COLORS
from turborag.cli import app
from turborag.core import modes
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.serve.schemas import TurboOptions
from turborag.store.codec import Damaged
from turborag.store.kv_store import KVStore

PASSAGES = ["Veltrano was founded by Ismena Throll.", "The Sallow runs through Brem."]


def test_every_reader_of_modes_takes_the_table():
    assert modes.MODES == ("auto", *(m.name for m in modes.TABLE))
    for name in modes.MODES:
        assert TurboOptions(mode=name).mode == name
        assert name in MODE_COLORS
    with pytest.raises(ValidationError):
        TurboOptions(mode="turbo-fast")
    squashed = "".join(CliRunner().invoke(app, ["ask", "--help"]).stdout.split())  # help wraps at hyphens
    assert all(name in squashed for name in modes.MODES)


@pytest.mark.parametrize("mode", [m.name for m in modes.TABLE])
def test_the_engine_answers_in_every_mode(mode, gemma_lm, tmp_path):
    engine = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"))
    a = engine.answer("Who founded Veltrano?", PASSAGES, mode, SamplingParams(max_new_tokens=3))
    assert a.mode == mode
    assert (a.cached_tokens > 0) == modes.get(mode).reuses_caches


def test_a_chunk_that_keeps_failing_its_check_ends_the_request(gemma_lm, tmp_path, monkeypatch):
    """Each attempt at assembly after a damaged chunk computes that chunk anew; a store that stays damaged
    ends the request with Damaged after one attempt more than there are chunks, never recursing on."""
    engine = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"))
    calls = []

    def damaged(*_args):
        calls.append(1)
        raise Damaged("bad")

    monkeypatch.setattr(engine, "_assemble_once", damaged)
    with pytest.raises(Damaged):
        engine.answer("Who founded Veltrano?", PASSAGES, "turbo", SamplingParams(max_new_tokens=1))
    assert len(calls) == len(PASSAGES) + 1
