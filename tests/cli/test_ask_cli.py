"""`turborag ingest / ask / remove / cache / bench ask / demo` on a tiny model folder: JSON shapes, and bad
input that gets one clear line and a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import cli_json, write_corpus
from rich.console import Console
from typer.testing import CliRunner

from turborag.cli import app
from turborag.core.prompt import ABSTAIN

runner = CliRunner()
INGEST_KEYS = {
    "documents",
    "chunks",
    "new_chunks",
    "removed_chunks",
    "tokens",
    "seconds",
    "cache_bytes",
    "found_caches",
}
ASK_KEYS = {"answer", "mode", "ttft_s", "total_s", "prompt_tokens", "cached_tokens", "chunks"}


_json = cli_json


@pytest.fixture
def ingested(env, tiny_model_dir):
    docs = write_corpus(env / "docs")
    (docs / "empty.txt").write_text("")
    r = runner.invoke(app, ["ingest", str(docs), "--model", tiny_model_dir, "--chunk-tokens", "64", "--json"])
    return docs, r


def test_ingest_json_and_default_store(ingested, env):
    docs, r = ingested
    out = _json(r)
    assert set(out) == INGEST_KEYS and out["documents"] == 10 and out["new_chunks"] == out["chunks"] > 10
    assert out["tokens"] > 0 and out["cache_bytes"] > 0 and out["removed_chunks"] == 0
    assert f"skipped {(docs / 'empty.txt').resolve()}: empty (no text)" in r.stderr
    assert (env / "home" / "store" / "catalog.sqlite").is_file()  # the documented default location
    again = _json(runner.invoke(app, ["ingest", str(docs), "--json"]))  # the store remembers its model
    assert again["new_chunks"] == 0 and again["tokens"] == 0 and again["chunks"] == out["chunks"]


def test_ask_json_and_streaming(ingested, env):
    for mode in ("turbo", "full", "turbo-composite"):
        out = _json(
            runner.invoke(
                app,
                [
                    "ask",
                    "Who rings the bell at the harbour?",
                    "--mode",
                    mode,
                    "--top-k",
                    "3",
                    "--max-new-tokens",
                    "4",
                    "--json",
                ],
            )
        )
        assert set(out) == ASK_KEYS and out["mode"] == mode and len(out["chunks"]) == 3
        assert out["chunks"][0].split("#")[0].endswith("harbour.md")
        assert 0 < out["ttft_s"] <= out["total_s"] and out["prompt_tokens"] > 0
        assert (out["cached_tokens"] > 0) == (mode != "full")
    # the default mode is auto: the tiny model has no cache-aware fine-tune, so turbo-blend, said in one line
    r = runner.invoke(app, ["ask", "Who rings the bell?", "--max-new-tokens", "3"])
    assert r.exit_code == 0 and "[turbo-blend] TTFT" in r.stderr and "passages: harbour.md#" in r.stderr
    assert r.stderr.startswith("note: ") and "`turborag finetune` would make plain turbo safe" in r.stderr
    r = runner.invoke(app, ["ask", "Who rings the bell?", "--max-new-tokens", "3", "--mode", "turbo"])
    assert r.exit_code == 0 and "[turbo] TTFT" in r.stderr and "note:" not in r.stderr


def test_ask_abstain_threshold(ingested, env):
    """A threshold every probability reaches gives the abstention reply; with --server it is an error, since
    a server answers with its own threshold."""
    args = ["ask", "Who rings the bell at the harbour?", "--max-new-tokens", "40", "--json"]
    out = _json(runner.invoke(app, [*args, "--abstain-threshold", "1e-300"]))
    assert out["answer"] == ABSTAIN
    assert _json(runner.invoke(app, [*args, "--abstain-threshold", "0"]))["answer"] != ABSTAIN
    r = runner.invoke(app, [*args, "--abstain-threshold", "0.5", "--server", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and "policy needs a local engine" in r.stderr


def test_ask_name_check(ingested, env):
    """--name-check declines a question naming something no retrieved passage mentions, and says which; a
    question without names is answered as before; with --server it is an error."""
    args = ["ask", "--max-new-tokens", "40", "--json"]
    out = _json(runner.invoke(app, [*args, "Who rings the bell at Quorvik Harbour?", "--name-check"]))
    assert out["answer"] == ABSTAIN and out["missing_names"] == ["Quorvik Harbour"]
    r = runner.invoke(
        app, ["ask", "Who rings the bell at Quorvik Harbour?", "--max-new-tokens", "40", "--name-check"]
    )
    assert r.exit_code == 0 and "declined: no passage mentions Quorvik Harbour" in r.stderr
    out = _json(runner.invoke(app, [*args, "Who rings the bell at Quorvik Harbour?", "--no-name-check"]))
    assert out["answer"] != ABSTAIN and "missing_names" not in out
    plain = [
        _json(runner.invoke(app, [*args, "Who rings the bell at the harbour?", *f]))
        for f in ([], ["--name-check"])
    ]
    assert plain[0]["answer"] == plain[1]["answer"] and "missing_names" not in plain[1]
    r = runner.invoke(app, [*args, "Who?", "--name-check", "--server", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and "policy needs a local engine" in r.stderr


def test_ask_errors(ingested, env, tiny_model_dir, tmp_path):
    r = runner.invoke(app, ["ask", "x" * 5000])  # the tiny model's window is 4096 tokens (1 char = 1 token)
    assert r.exit_code == 2 and "more than the model's context window of 4096" in r.stderr
    r = runner.invoke(app, ["ask", "q", "--mode", "warp"])
    assert r.exit_code == 2 and r.stderr.startswith("error: unknown mode warp")

    other = tmp_path / "other-model"  # same architecture, different weights
    import torch
    from conftest import char_tokenizer, make

    model = make("gemma3")
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    model.save_pretrained(other)
    char_tokenizer().save_pretrained(other)
    r = runner.invoke(app, ["ask", "q", "--model", str(other)])
    assert r.exit_code == 2 and "was built with model" in r.stderr and "Traceback" not in r.output

    r = runner.invoke(app, ["ask", "q", "--store", str(tmp_path / "docs")])
    assert r.exit_code == 2 and "is not a turborag store" in r.stderr
    r = runner.invoke(app, ["ask", "q", "--store", str(tmp_path / "nowhere")])
    assert r.exit_code == 2 and "no store at" in r.stderr


def test_many_passages_are_trimmed_to_the_window(env, tiny_model_dir):
    docs = env / "docs"
    docs.mkdir()
    for i in range(8):
        (docs / f"{i}.txt").write_text(f"Document {i}. " + "Words fill this line. " * 60)
    _json(
        runner.invoke(
            app,
            [
                "ingest",
                str(docs),
                "--model",
                tiny_model_dir,
                "--chunk-tokens",
                "1024",
                "--overlap",
                "0",
                "--json",
            ],
        )
    )
    r = runner.invoke(app, ["ask", "Which document?", "--top-k", "8", "--max-new-tokens", "2", "--json"])
    out = _json(r)
    assert "do not fit the context window" in r.stderr and 0 < len(out["chunks"]) < 8
    assert out["prompt_tokens"] + 2 <= 4096


def test_nonexistent_path_is_one_line_exit_2(env):
    r = subprocess.run(
        [sys.executable, "-m", "turborag", "ingest", str(env / "nope")],
        capture_output=True,
        text=True,
        env={**os.environ, "TURBORAG_HOME": str(env / "home")},
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: no such file or folder: {env / 'nope'}"
    ]
    assert not (env / "home" / "store").exists()  # nothing created


def test_store_written_by_another_format(ingested, env):
    import sqlite3

    db = sqlite3.connect(env / "home" / "store" / "catalog.sqlite")
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    db.commit()
    db.close()
    r = runner.invoke(app, ["cache", "stats"])
    assert r.exit_code == 2 and "format version 99/1" in r.stderr and "new --store" in r.stderr


def test_cache_stats_verify_gc_remove(ingested, env):
    docs, r = ingested
    chunks = _json(r)["chunks"]
    stats = _json(runner.invoke(app, ["cache", "stats", "--json"]))
    assert stats["chunks"] == chunks and stats["documents"] == 10 and stats["orphan_files"] == 0
    assert stats["disk_bytes"] == stats["cache_bytes"] > 0 and stats["chunk_tokens"] == 64
    assert _json(runner.invoke(app, ["cache", "verify", "--json"]))["damaged"] == 0

    kv = sorted((env / "home" / "store" / "kv").glob("*/*.safetensors"))
    kv[0].write_bytes(kv[0].read_bytes()[:-10])  # truncated
    kv[1].unlink()
    orphan = kv[2].with_name("0" * 64 + ".safetensors")
    orphan.write_bytes(kv[2].read_bytes())
    r = runner.invoke(app, ["cache", "verify", "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout) == {
        "ok": len(kv) - 2,
        "missing": 1,
        "damaged": 1,
        "formats": {"1": 0, "2": len(kv) - 2},
    }
    assert "--repair" in r.stderr and not kv[0].exists()  # damaged file removed, never used
    assert _json(runner.invoke(app, ["cache", "gc", "--json"]))["files_removed"] == 1 and not orphan.exists()
    repaired = _json(runner.invoke(app, ["cache", "verify", "--repair", "--json"]))
    assert repaired["repaired"] == 2 and repaired["missing"] == 2 and repaired["damaged"] == 0
    assert kv[0].exists() and kv[1].exists()
    assert _json(runner.invoke(app, ["ingest", str(docs), "--json"]))["new_chunks"] == 0
    assert _json(runner.invoke(app, ["cache", "verify", "--json"])) == {
        "ok": len(kv),
        "missing": 0,
        "damaged": 0,
        "formats": {"1": 0, "2": len(kv)},
    }

    r = runner.invoke(app, ["remove", str(docs / "bakery.txt"), "--json"])
    assert _json(r)["documents"] == 1
    r = runner.invoke(app, ["remove", str(docs / "bakery.txt")])
    assert r.exit_code == 1 and "nothing in" in r.stderr
    (docs / "library.md").unlink()
    out = _json(runner.invoke(app, ["ingest", str(docs), "--prune", "--json"]))
    assert out["documents"] == 9 and out["removed_chunks"] > 0  # bakery is back, library pruned


def test_bench_ask(env, tiny_model_dir):
    docs = write_corpus(env / "docs")
    r = runner.invoke(
        app,
        [
            "bench",
            "ask",
            "--corpus",
            str(docs),
            "--model",
            tiny_model_dir,
            "--top-k",
            "2,4",
            "--questions",
            "2",
            "--json",
        ],
    )
    out = _json(r)
    assert out["ingest"]["documents"] == 10 and out["ingest"]["tokens_per_s"] > 0
    assert [row["top_k"] for row in out["rows"]] == [2, 4]
    assert all(row["full_ttft_s"] > 0 and row["turbo_ttft_s"] > 0 for row in out["rows"])


def test_demo_ingests_the_bundled_corpus(env, gemma_lm):
    from turborag.bench.demo import corpus_files, run_demo
    from turborag.core.engine import Engine
    from turborag.store.kv_store import KVStore

    files = corpus_files()
    assert len(files) >= 12 and sum(f.stat().st_size for f in files) < 200_000
    engine = Engine(gemma_lm, KVStore(env / "demo-store"))
    some = [f for f in files if f.stem in ("break", "continue", "pass", "lambda")]
    rows = run_demo(engine, Console(width=200), questions=["What does the break statement do?"], corpus=some)
    assert rows[0]["chunks"][0].split("#")[0].endswith("break.md")
    assert rows[0]["full"].ttft_s > 0 and rows[0]["turbo"].cached_tokens > 0


def test_disk_full_during_ingest_is_one_line_exit_1(env, tiny_model_dir, monkeypatch):
    import errno

    from turborag.store.kv_store import KVStore

    docs = write_corpus(env / "docs")

    def full(self, key, value):
        raise OSError(errno.ENOSPC, "No space left on device")

    real = KVStore.put
    monkeypatch.setattr(KVStore, "put", full)
    r = runner.invoke(app, ["ingest", str(docs), "--model", tiny_model_dir])
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "No space left on device" in r.stderr and "free some disk space" in r.stderr
    monkeypatch.setattr(KVStore, "put", real)
    assert _json(runner.invoke(app, ["cache", "stats", "--json"]))["documents"] == 0  # readable, consistent
    assert _json(runner.invoke(app, ["ingest", str(docs), "--json"]))["documents"] == 10


@pytest.fixture
def fp32_store(env, tiny_model_dir) -> str:
    """A store ingested with --dtype float32 (caches in fp16)."""
    docs = write_corpus(env / "docs")
    store = str(env / "fp32-store")
    ingest = ["ingest", str(docs), "--store", store, "--model", tiny_model_dir, "--dtype", "float32"]
    assert _json(runner.invoke(app, [*ingest, "--json"]))["new_chunks"] > 0
    return store


def _ask_json(store: str) -> dict:
    return _json(
        runner.invoke(
            app, ["ask", "Who rings the bell?", "--store", store, "--max-new-tokens", "2", "--json"]
        )
    )


def test_store_keeps_its_dtype(fp32_store):
    """A store remembers the compute dtype its caches were made in: ask follows it, another is refused."""
    import sqlite3

    meta = dict(sqlite3.connect(f"{fp32_store}/catalog.sqlite").execute("SELECT key, value FROM meta"))
    assert meta["dtype"] == "float32" and meta["store_dtype"] == "float16"
    assert _ask_json(fp32_store)["cached_tokens"] > 0
    r = runner.invoke(app, ["ask", "Who rings the bell?", "--store", fp32_store, "--dtype", "bfloat16"])
    assert r.exit_code == 2 and "uses dtype float32, not bfloat16" in r.stderr and "Traceback" not in r.output
    r = runner.invoke(app, ["ask", "Who rings the bell?", "--store", fp32_store, "--dtype", "fp8"])
    assert r.exit_code == 2 and "unknown dtype 'fp8'" in r.stderr


def test_store_from_before_dtype_is_read_as_fp32(fp32_store):
    """A store written before `--dtype` existed has no dtype in its meta: it was computed in fp32 on CPU."""
    import sqlite3

    db = sqlite3.connect(f"{fp32_store}/catalog.sqlite")
    db.execute("DELETE FROM meta WHERE key = 'dtype'")
    db.commit()
    r = runner.invoke(
        app, ["ask", "Who rings the bell?", "--store", fp32_store, "--max-new-tokens", "2", "--json"]
    )
    assert _json(r)["cached_tokens"] > 0 and "recomputed" not in r.stderr  # its caches are used as they are
