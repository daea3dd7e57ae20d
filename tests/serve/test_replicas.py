"""Many servers, one store: two `turborag serve --read-only` replicas over one catalog and one shared Redis KV
store, behind a round-robin client. Both answer from the shared caches (nothing computed), a document
ingested while they run is retrieved by both without a restart (the catalog's generation moves), and a
replica refuses writes: its catalog is opened with SQLite's mode=ro."""

from __future__ import annotations

import itertools
import sqlite3

import httpx
import pytest
from helpers import write_corpus
from redis_servers import redis_server  # noqa: F401
from typer.testing import CliRunner

from turborag.bench.serve import ServedApp
from turborag.cli import app
from turborag.cli.serve import served_for
from turborag.serve import create_app

FACT = "The zorblat festival of Quintara is held on the ninth moon and honours glass-blowers."


def _ingest(paths, store, url, model):
    args = ["ingest", str(paths), "--store", str(store), "--model", model, "--chunk-tokens", "64"]
    r = CliRunner().invoke(app, [*args, "--store-url", url])
    assert r.exit_code == 0, r.output


def test_two_replicas_share_one_store_and_see_new_ingests(env, tiny_model_dir, redis_server):  # noqa: F811
    store = env / "store"
    _ingest(write_corpus(env / "docs"), store, redis_server.url, tiny_model_dir)
    replicas = [ServedApp(create_app(served_for(store, None, "cpu", 4, read_only=True))) for _ in range(2)]
    with replicas[0] as a, replicas[1] as b:
        urls = itertools.cycle([a.url, b.url])  # the load balancer

        def ask(question: str) -> tuple[str, dict]:
            url = next(urls)
            body = {
                "model": "turborag",
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 2,
                "turborag": {"mode": "turbo", "top_k": 1},
            }
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            out = r.json()
            return url, {**out["turborag"], "answer": out["choices"][0]["message"]["content"]}

        first = [ask("Who rings the harbour bell?") for _ in range(2)]
        assert {u for u, _ in first} == {a.url, b.url}
        assert first[0][1]["chunks"] == first[1][1]["chunks"]  # same store, same retrieval
        assert first[0][1]["answer"] == first[1][1]["answer"]  # and the same greedy answer
        assert all(t["computed_chunks"] == 0 for _, t in first)  # caches read from the shared Redis

        news = env / "news"
        news.mkdir()
        (news / "zorblat.txt").write_text(FACT + "\n")
        _ingest(news, store, redis_server.url, tiny_model_dir)  # while both replicas run
        later = [ask("When is the zorblat festival of Quintara held?") for _ in range(2)]
        assert {u for u, _ in later} == {a.url, b.url}
        for _, t in later:
            assert t["chunks"][0]["name"] == "zorblat.txt" and t["computed_chunks"] == 0


def test_read_only_replica_refuses_writes(env, tiny_model_dir):
    """A replica answers, but uploads, deletes and collection changes get 403 `read_only_replica`, and its
    catalog handle cannot write even if code tried (SQLite mode=ro); the index snapshot is left to the
    ingesting process."""
    from turborag.store.catalog import Catalog

    store = env / "store"
    args = ["ingest", str(write_corpus(env / "docs")), "--store", str(store), "--model", tiny_model_dir]
    r = CliRunner().invoke(app, [*args, "--chunk-tokens", "64"])
    assert r.exit_code == 0, r.output
    (store / "index.safetensors").unlink()
    backend = served_for(store, None, "cpu", 4, read_only=True)
    with ServedApp(create_app(backend)) as srv:
        body = {"model": "turborag", "messages": [{"role": "user", "content": "Who rings the bell?"}]}
        r = httpx.post(srv.url + "/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=120)
        assert r.status_code == 200, r.text
        docs = httpx.get(srv.url + "/v1/documents", timeout=30).json()["data"]
        writes = [
            httpx.post(srv.url + "/v1/documents", json={"name": "a.txt", "text": "new text"}, timeout=30),
            httpx.delete(srv.url + f"/v1/documents/{docs[0]['id']}", timeout=30),
            httpx.post(srv.url + "/v1/collections", json={"name": "other"}, timeout=30),
            httpx.delete(srv.url + "/v1/collections/default", timeout=30),
        ]
        for w in writes:
            assert w.status_code == 403 and w.json()["error"]["code"] == "read_only_replica", w.text
        assert len(httpx.get(srv.url + "/v1/documents", timeout=30).json()["data"]) == len(docs)
    assert not (store / "index.safetensors").exists()  # rebuilt in memory, not written by the replica
    catalog = Catalog(store, read_only=True)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        catalog.set_meta(note="x")
    with pytest.raises(ValueError):
        Catalog(store, create=True, read_only=True)
