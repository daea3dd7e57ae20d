"""`turborag bench abstain` on a tiny model: both variants measured per size, the threshold put back."""

from __future__ import annotations

import pytest
import torch
from conftest import char_tokenizer, make
from helpers import cli_json
from typer.testing import CliRunner

from turborag.bench.engine import bench_abstain_cost
from turborag.cli import app
from turborag.core.engine import Engine
from turborag.core.model import LoadedModel, fingerprint
from turborag.store.kv_store import KVStore

runner = CliRunner()


def test_rows_and_the_threshold_is_restored(tmp_path):
    model, tok = make("gemma3"), char_tokenizer()
    lm = LoadedModel(model, tok, "tiny", fingerprint(model, tok), torch.device("cpu"), torch.float32)
    engine = Engine(lm, KVStore(tmp_path, cache_format="float32"))
    engine.abstain_threshold = 0.35
    rows = bench_abstain_cost(engine, [64, 128], repeats=2, chunk_tokens=32, log=lambda r: None)
    assert [r.context_tokens for r in rows] == [64, 128]
    for r in rows:
        assert r.turbo_ttft_s > 0 and r.scored_ttft_s > 0
        assert r.overhead == pytest.approx(r.scored_ttft_s / r.turbo_ttft_s)
    assert engine.abstain_threshold == 0.35


def test_cli_json(tiny_model_dir, env):
    args = ["bench", "abstain", "--model", tiny_model_dir, "--repeats", "1", "--chunk-tokens", "32"]
    out = cli_json(runner.invoke(app, [*args, "--context-tokens", "64", "--json"]))
    assert [row["context_tokens"] for row in out["rows"]] == [64] and out["repeats"] == 1
    assert set(out["rows"][0]) == {"context_tokens", "turbo_ttft_s", "scored_ttft_s", "overhead"}
