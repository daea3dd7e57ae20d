"""`turborag ingest --dry-run`: what the paths would add, with nothing computed or written, and the same
chunks, tokens and cache bytes a real ingest then stores."""

from __future__ import annotations

import json

from helpers import write_corpus
from typer.testing import CliRunner

from turborag.cli import app

runner = CliRunner()


def test_dry_run_counts_what_the_ingest_then_stores(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    docs, store = write_corpus(tmp_path / "docs"), tmp_path / "store"
    args = ["ingest", str(docs), "--store", str(store), "--model", tiny_model_dir, "--chunk-tokens", "64"]
    r = runner.invoke(app, [*args, "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    planned = json.loads(r.stdout.strip().splitlines()[-1])
    assert not store.exists()  # nothing written
    assert planned["documents"] == 10 and planned["chunks"] > 10
    assert planned["cache_format"] in ("float16", "bfloat16")  # the compute dtype's, which the CPU decides

    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    done = json.loads(r.stdout.strip().splitlines()[-1])
    assert (done["documents"], done["chunks"], done["tokens"]) == (
        planned["documents"],
        planned["chunks"],
        planned["tokens"],
    )
    # the files add a header of a few hundred bytes each to the tensors counted
    assert planned["cache_bytes"] < done["cache_bytes"] < planned["cache_bytes"] + 2048 * done["chunks"]

    # on an existing store, its settings (model, chunking, cache format) are the ones counted
    r = runner.invoke(app, ["ingest", str(docs), "--store", str(store), "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    again = json.loads(r.stdout.strip().splitlines()[-1])
    assert again == planned


def test_dry_run_text_names_the_counts(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    docs = write_corpus(tmp_path / "docs")
    r = runner.invoke(app, ["ingest", str(docs), "--model", tiny_model_dir, "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "10 documents" in r.stdout
    assert "MB of float16 caches" in r.stdout or "MB of bfloat16 caches" in r.stdout
    assert not (tmp_path / "home" / "store").exists()
