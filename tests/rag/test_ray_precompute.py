"""`turborag ingest --ray`: precompute on a real (local, loopback) Ray cluster gives the same store as a local
ingest, survives a worker that dies mid-run, and a rerun computes only what is missing.

Ray is an optional extra: without it these tests skip (under CI, which installs it, they fail instead).
"""

from __future__ import annotations

import os
import sqlite3

import numpy as np
import pytest
from helpers import QUESTIONS, cli_json, write_corpus
from typer.testing import CliRunner

from turborag.cli import app
from turborag.rag.ray_precompute import FAIL_ONCE_ENV

runner = CliRunner()


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory):
    """A local Ray cluster for the module; the first actor to run dies once (FAIL_ONCE_ENV)."""
    try:
        import ray
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("Ray is not installed (CI installs turborag[ray])")
        pytest.skip("Ray tests need `pip install 'turborag[ray]'`")
    flag = tmp_path_factory.mktemp("ray") / "died"
    os.environ[FAIL_ONCE_ENV] = str(flag)
    yield flag
    os.environ.pop(FAIL_ONCE_ENV, None)
    ray.shutdown()


def _ingest(docs, store, model, *extra):
    args = ["ingest", str(docs), "--store", str(store), "--model", model, "--chunk-tokens", "64", "--json"]
    return cli_json(runner.invoke(app, [*args, *extra]))


def _chunks(store) -> dict[str, tuple[str, int, np.ndarray]]:
    """chunk text -> (cache key, cache bytes, embedding) from a store's catalog."""
    db = sqlite3.connect(store / "catalog.sqlite")
    query = (
        "SELECT c.text, c.cache_key, e.bytes, c.embedding FROM chunks c "
        "JOIN cache_entries e ON e.key = c.cache_key"
    )
    rows = db.execute(query).fetchall()
    return {t: (k, b, np.frombuffer(v, np.float32)) for t, k, b, v in rows}


def test_ray_ingest_equals_local_and_survives_a_dead_worker(env, tiny_model_dir, ray_local):
    docs = write_corpus(env / "docs")
    local = _ingest(docs, env / "local", tiny_model_dir)
    ray_run = _ingest(docs, env / "ray", tiny_model_dir, "--ray", "local", "--ray-workers", "1")
    assert ray_local.exists()  # a worker died mid-run ...
    assert (
        ray_run["chunks"] == local["chunks"] and ray_run["new_chunks"] == local["new_chunks"]
    )  # ... yet all
    assert ray_run["tokens"] == local["tokens"] > 0  # tokens computed: every cache, once
    a, b = _chunks(env / "local"), _chunks(env / "ray")
    assert a.keys() == b.keys()
    for text, (key, size, vec) in a.items():
        assert b[text][0] == key and b[text][1] == size > 0
        assert np.allclose(b[text][2], vec, atol=1e-5)
    ask = ["ask", QUESTIONS[0][0], "--store", str(env / "ray"), "--max-new-tokens", "4", "--json"]
    asked = cli_json(runner.invoke(app, ask))
    assert asked["cached_tokens"] > 0 and asked["answer"] is not None
    stats = cli_json(runner.invoke(app, ["cache", "stats", "--store", str(env / "ray"), "--json"]))
    assert stats["missing_caches"] == 0  # every cache the catalog names is in the store


def test_ray_rerun_computes_only_what_is_missing(env, tiny_model_dir, ray_local):
    docs = write_corpus(env / "docs")
    first = _ingest(docs, env / "s", tiny_model_dir, "--ray", "local", "--ray-workers", "1")
    same = _ingest(docs, env / "s", tiny_model_dir, "--ray", "local", "--ray-workers", "1")
    assert same["tokens"] == 0 and same["new_chunks"] == 0  # a second run computes nothing
    kv = env / "s" / "kv"
    files = sorted(p for p in kv.rglob("*") if p.is_file() and p.suffix != ".lock")
    files[0].unlink()  # a cache lost (a killed run, an evicted file): only it is computed again
    again = _ingest(docs, env / "s", tiny_model_dir, "--ray", "local", "--ray-workers", "1")
    assert 0 < again["tokens"] < first["tokens"] / 2  # one chunk's tokens, not the corpus's


def test_bench_ingest_reports_each_worker_count(env, tiny_model_dir, ray_local):
    args = ["bench", "ingest", "--workers", "1", "--docs", "2", "--model", tiny_model_dir, "--json"]
    out = cli_json(runner.invoke(app, args))
    local, one = out["rows"]
    assert local["workers"] == "local" and one["workers"] == 1
    assert one["chunks"] == local["chunks"] > 0 and one["tokens"] == local["tokens"] > 0
    assert one["tokens_per_s"] > 0
