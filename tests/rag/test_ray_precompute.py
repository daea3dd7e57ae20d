"""`turborag ingest --ray`: precompute on a real (local, loopback) Ray cluster with 2 workers gives the same
store as a local ingest, survives a worker that dies mid-run, a rerun computes only what is missing, and an
ingest whose driver is killed mid-run resumes with only the rest.

Ray is an optional extra: without it these tests skip (under CI, which installs it, they fail instead).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import QUESTIONS, cli_json, write_corpus
from typer.testing import CliRunner

from turborag.cli import app
from turborag.rag.ray_precompute import BATCH_DELAY_ENV, FAIL_ONCE_ENV

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


def _cache_files(store) -> list:
    return sorted(p for p in (store / "kv").rglob("*") if p.is_file() and p.suffix not in (".lock", ".tmp"))


def test_ray_ingest_equals_local_and_survives_a_dead_worker(env, tiny_model_dir, ray_local):
    docs = write_corpus(env / "docs")
    local = _ingest(docs, env / "local", tiny_model_dir)
    ray_run = _ingest(docs, env / "ray", tiny_model_dir, "--ray", "local", "--ray-workers", "2")
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
    first = _ingest(docs, env / "s", tiny_model_dir, "--ray", "local", "--ray-workers", "2")
    same = _ingest(docs, env / "s", tiny_model_dir, "--ray", "local", "--ray-workers", "2")
    assert same["tokens"] == 0 and same["new_chunks"] == 0  # a second run computes nothing
    files = _cache_files(env / "s")
    files[0].unlink()  # a cache lost (a killed run, an evicted file): only it is computed again
    again = _ingest(docs, env / "s", tiny_model_dir, "--ray", "local", "--ray-workers", "2")
    assert 0 < again["tokens"] < first["tokens"] / 2  # one chunk's tokens, not the corpus's


def test_bench_ingest_reports_each_worker_count(env, tiny_model_dir, ray_local):
    args = ["bench", "ingest", "--workers", "1", "--docs", "2", "--model", tiny_model_dir, "--json"]
    out = cli_json(runner.invoke(app, args))
    local, one = out["rows"]
    assert local["workers"] == "local" and one["workers"] == 1
    assert one["chunks"] == local["chunks"] > 0 and one["tokens"] == local["tokens"] > 0
    assert one["tokens_per_s"] > 0


def _notes(folder, n: int = 40):
    """n one-chunk documents: enough for several Ray batches (16 chunks each)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"note{i:02d}.txt").write_text(f"Lamp {i} of the harbour is painted shade {i * 7}.\n")
    return folder


def test_killed_driver_resumes_with_only_the_rest(env, tiny_model_dir, ray_local):
    """SIGKILL the driver (and its local Ray cluster) once the first caches are stored: nothing is in the
    catalog yet, and the rerun computes only the caches the killed run had not stored, ending with exactly
    the store of a local ingest."""
    docs = _notes(env / "notes")
    local = _ingest(docs, env / "local", tiny_model_dir)
    store = env / "s"
    cmd = [sys.executable, "-m", "turborag", "ingest", str(docs), "--store", str(store), "--model"]
    cmd += [tiny_model_dir, "--chunk-tokens", "64", "--ray", "local", "--ray-workers", "2", "--json"]
    child_env = {k: v for k, v in os.environ.items() if k != FAIL_ONCE_ENV} | {BATCH_DELAY_ENV: "4"}
    proc = subprocess.Popen(
        cmd, env=child_env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 180
        while not (store / "kv").is_dir() or not _cache_files(store):
            assert proc.poll() is None, f"the ingest ended before it was killed: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "no cache was stored within 180 s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray cluster it started
        proc.wait()
    stored = len(_cache_files(store))
    assert 0 < stored < local["chunks"]
    db = sqlite3.connect(store / "catalog.sqlite")
    assert db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0] == 0  # the driver had committed nothing
    db.close()

    resumed = _ingest(docs, store, tiny_model_dir, "--ray", "local", "--ray-workers", "2")
    assert resumed["new_chunks"] == local["new_chunks"] == 40
    per_chunk = local["tokens"] / local["chunks"]
    assert 0 < resumed["tokens"] <= local["tokens"] - stored * per_chunk * 0.5  # only the rest computed
    a, b = _chunks(env / "local"), _chunks(store)
    assert a.keys() == b.keys()
    assert all(b[t][0] == key and b[t][1] == size for t, (key, size, _) in a.items())
