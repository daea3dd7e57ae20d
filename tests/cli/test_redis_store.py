"""Stores whose caches live in Redis or a Redis Cluster, end to end through the CLI, and the faults: Redis
down at start, gone mid-request, restarted empty, and two ingests writing into one Redis at once."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from helpers import QUESTIONS, cli_json, write_corpus
from redis_servers import RedisServer, free_port, redis_cluster, redis_server, require_redis  # noqa: F401
from typer.testing import CliRunner

from turborag.cli import app

runner = CliRunner()
QUESTION = QUESTIONS[0][0]  # answered by harbour.md


def _ingest(docs, store, url, model):
    args = ["ingest", str(docs), "--store", str(store), "--model", model, "--chunk-tokens", "64"]
    return cli_json(runner.invoke(app, [*args, "--store-url", url, "--json"]))


def _ask(store, mode="turbo"):
    args = ["ask", QUESTION, "--store", str(store), "--mode", mode, "--max-new-tokens", "6", "--json"]
    return runner.invoke(app, args)


@pytest.mark.parametrize("kind", ["single", "cluster"])
def test_ingest_and_ask_through_redis(env, tiny_model_dir, kind, request):
    server = request.getfixturevalue("redis_server" if kind == "single" else "redis_cluster")
    docs = write_corpus(env / "docs")
    out = _ingest(docs, env / kind, server.url, tiny_model_dir)
    assert out["new_chunks"] == out["chunks"] > 0 and out["cache_bytes"] > 0
    assert not (env / kind / "kv").exists()  # no cache in the store's folder
    turbo, full = cli_json(_ask(env / kind)), cli_json(_ask(env / kind, "full"))
    assert turbo["cached_tokens"] > 0 and turbo["chunks"][0].split("#")[0].endswith("harbour.md")
    stats = cli_json(runner.invoke(app, ["cache", "stats", "--store", str(env / kind), "--json"]))
    assert stats["backend"].startswith(("redis://", "redis+cluster://")) and stats["missing_caches"] == 0
    assert stats["cache_files"] == stats["cache_entries"] > 0
    assert full["answer"] and turbo["answer"]


def test_redis_down_at_start_is_one_line(env, tiny_model_dir):
    require_redis()
    docs = write_corpus(env / "docs")
    url = f"redis://127.0.0.1:{free_port()}/0"
    args = ["ingest", str(docs), "--store", str(env / "s"), "--model", tiny_model_dir, "--store-url", url]
    t0 = time.monotonic()
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and r.stderr.startswith(f"error: cannot reach Redis at {url}")
    assert len(r.stderr.strip().splitlines()) == 1 and time.monotonic() - t0 < 30


def test_redis_gone_then_back_empty(env, tiny_model_dir, tmp_path):
    """Gone mid-way: `ask` computes what it cannot read (and says so) instead of failing or hanging.
    Back, but empty: `cache verify` sees every cache missing and `--repair` recomputes them."""
    require_redis()
    server = RedisServer(tmp_path / "redis").start()
    try:
        docs = write_corpus(env / "docs")
        _ingest(docs, env / "s", server.url, tiny_model_dir)
        want = cli_json(_ask(env / "s"))
        server.stop()
        t0 = time.monotonic()
        r = runner.invoke(
            app, ["ask", QUESTION, "--store", str(env / "s"), "--mode", "turbo", "--max-new-tokens", "6"]
        )
        assert r.exit_code == 2 and "cannot reach Redis" in r.stderr  # down when the store is opened
        assert time.monotonic() - t0 < 60

        server.start()  # same port, no data: a restarted Redis without persistence
        got = cli_json(_ask(env / "s"))
        assert got["answer"] == want["answer"]  # computed again (and stored again) by the request
        verify = runner.invoke(app, ["cache", "verify", "--store", str(env / "s"), "--json"])
        assert verify.exit_code == 1 and json.loads(verify.stdout.splitlines()[-1])["missing"] > 0
        fixed = cli_json(
            runner.invoke(app, ["cache", "verify", "--repair", "--store", str(env / "s"), "--json"])
        )
        assert fixed["repaired"] == fixed["missing"] > 0
        after = runner.invoke(app, ["cache", "verify", "--store", str(env / "s"), "--json"])
        assert after.exit_code == 0 and cli_json(after)["missing"] == 0
    finally:
        server.stop()


def test_redis_gone_mid_request_is_a_miss_not_a_failure(gemma_lm, tmp_path):
    require_redis()
    from turborag.core.engine import Engine
    from turborag.store.kv_store import KVStore
    from turborag.store.urls import open_backend

    server = RedisServer(tmp_path / "redis").start()
    try:
        passages = [
            "The harbour master rings a brass bell at six.",
            "The bakery sells honey knots on Fridays.",
        ]
        engine = Engine(gemma_lm, KVStore(open_backend(server.url), "float32"))
        engine.stop_ids = set()
        engine.precompute(passages)
        want = engine.answer("Who rings the bell?", passages, "turbo")
        assert want.computed_chunks == 0
        server.stop()
        t0 = time.monotonic()
        got = engine.answer("Who rings the bell?", passages, "turbo")
        assert got.token_ids == want.token_ids and got.computed_chunks == len(passages)
        assert engine.store.unavailable == 1 and time.monotonic() - t0 < 30
    finally:
        server.stop()


def test_two_ingests_into_one_redis_lose_nothing(env, tiny_model_dir, redis_server):  # noqa: F811
    """Two stores (two catalogs: two teams, or two ingest jobs) writing into one shared Redis at once."""
    docs_a, docs_b = write_corpus(env / "a"), write_corpus(env / "b")
    (docs_b / "extra.md").write_text("A second corpus shares most of its text with the first one.")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "turborag",
                "ingest",
                str(d),
                "--store",
                str(env / f"store-{n}"),
                "--model",
                tiny_model_dir,
                "--chunk-tokens",
                "64",
                "--store-url",
                redis_server.url,
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n, d in (("a", docs_a), ("b", docs_b))
    ]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    for n in "ab":
        verify = runner.invoke(app, ["cache", "verify", "--store", str(env / f"store-{n}"), "--json"])
        assert verify.exit_code == 0 and cli_json(verify)["missing"] == 0 and cli_json(verify)["ok"] > 0
