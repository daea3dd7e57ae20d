"""Ingest: incremental (unchanged = nothing computed, one edit = only its chunks), resumable after kill -9,
damaged caches recomputed, disk-full safe, store validation, retrieval quality on a made-up corpus."""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import subprocess
import sys

import pytest
from helpers import CORPUS, QUESTIONS, write_corpus
from typer.testing import CliRunner

from turborag.cli import app
from turborag.core import kv
from turborag.core.engine import Engine
from turborag.rag.chunker import Chunker
from turborag.rag.embed import EMBEDDER, Embedder
from turborag.rag.ingest import Ingestor, StoreWriteError, remove
from turborag.rag.retrieve import Retriever
from turborag.store.catalog import Catalog, StoreError
from turborag.store.kv_store import KVStore
from turborag.store.settings import StoreSettings

runner = CliRunner()


def _setup(root, lm, size=64, overlap=8):
    catalog = Catalog(root, create=True)
    engine = Engine(lm, KVStore(root))
    catalog.bind(
        StoreSettings(
            model=lm.name,
            model_fingerprint=lm.fingerprint,
            template=engine.layout.template,
            cache_format="float16",
            embedder=EMBEDDER,
            chunk_tokens=size,
            chunk_overlap=overlap,
        )
    )
    return engine, catalog, Ingestor(engine, catalog, Embedder(), Chunker(lm.tokenizer, size, overlap))


@pytest.fixture
def computed(monkeypatch):
    """Counts the chunks whose KV is computed (every path to the model goes through kv.precompute_chunks)."""
    seen: list[int] = []
    real = kv.precompute_chunks

    def counting(model, prefix, chunks, *a, **k):
        seen.extend(len(c) for c in chunks)
        return real(model, prefix, chunks, *a, **k)

    monkeypatch.setattr(kv, "precompute_chunks", counting)
    return seen


def _cache_files(root):
    return sorted((root / "kv").glob("*/*.safetensors"))


def test_incremental_ingest(tmp_path, gemma_lm, computed):
    docs = write_corpus(tmp_path / "docs")
    engine, catalog, ing = _setup(tmp_path / "store", gemma_lm)
    first = ing.run([docs])
    assert first.documents == 10 and first.new_chunks == first.chunks == first.computed_chunks > 10
    assert first.tokens == sum(computed) and first.cache_bytes > 0 and first.removed_chunks == 0
    assert len(_cache_files(tmp_path / "store")) == first.chunks
    before = {f: f.stat().st_mtime_ns for f in _cache_files(tmp_path / "store")}

    computed.clear()
    again = ing.run([docs])
    assert (again.new_chunks, again.removed_chunks, again.tokens, again.cache_bytes) == (0, 0, 0, 0)
    assert again.unchanged_documents == 10 and again.chunks == first.chunks and computed == []

    bakery = docs / "bakery.txt"
    old_ids = catalog.chunk_ids([str(bakery.resolve())])
    bakery.write_text(bakery.read_text().replace("Fridays", "Sundays and holidays"))
    edited = ing.run([docs])
    new_ids = catalog.chunk_ids([str(bakery.resolve())])
    changed = new_ids - old_ids
    assert edited.unchanged_documents == 9
    assert edited.new_chunks == len(changed) > 0 and edited.removed_chunks == len(old_ids - new_ids)
    assert edited.computed_chunks == len(computed) <= len(changed)  # only the edited file's new chunks
    after = _cache_files(tmp_path / "store")
    assert len(after) == catalog.stats()["cache_entries"] == catalog.stats()["chunks"]  # old caches deleted
    assert all(before[f] == f.stat().st_mtime_ns for f in after if f in before)  # others untouched


def test_jsonl_record_edit_recomputes_only_that_record(tmp_path, gemma_lm, computed):
    records = [{"id": i, "text": text} for i, text in enumerate(CORPUS.values())]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    _, catalog, ing = _setup(tmp_path / "store", gemma_lm)
    assert ing.run([path]).documents == 10
    records[3]["text"] = "The festival was moved to spring."
    del records[7]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    computed.clear()
    res = ing.run([path])
    assert res.documents == 9 and res.unchanged_documents == 8
    assert res.computed_chunks == len(computed) == 1  # the short new record is one chunk
    assert catalog.stats()["documents"] == 9


def test_remove_and_prune(tmp_path, gemma_lm):
    docs = write_corpus(tmp_path / "docs")
    engine, catalog, ing = _setup(tmp_path / "store", gemma_lm)
    total = ing.run([docs]).chunks
    n_weather = len(catalog.chunk_ids([str((docs / "weather.txt").resolve())]))
    assert remove(catalog, engine.store, [docs / "weather.txt"]) == (1, n_weather)
    (docs / "school.md").unlink()
    res = ing.run([docs], prune=True)
    assert res.documents == 9 - 1 + 1  # weather came back (its file is still there), school is gone
    assert res.removed_chunks > 0 and catalog.stats()["documents"] == 9
    assert len(_cache_files(tmp_path / "store")) == catalog.stats()["cache_entries"] < total


def test_damaged_cache_is_recomputed_never_used(tmp_path, gemma_lm, caplog):
    docs = write_corpus(tmp_path / "docs")
    engine, catalog, ing = _setup(tmp_path / "store", gemma_lm)
    ing.run([docs])
    retriever = Retriever(catalog, Embedder())
    passages = retriever.search("Who rings the bell at the harbour?", 2)
    key = engine.key(engine.layout.chunk_ids(passages[0].text))
    reference = engine.answer("Who rings the bell?", [p.text for p in passages], "turbo")
    blob = bytearray(engine.store.path(key).read_bytes())
    blob[-9] ^= 0xFF
    engine.store.path(key).write_bytes(bytes(blob))
    with caplog.at_level(logging.WARNING):
        a = engine.answer("Who rings the bell?", [p.text for p in passages], "turbo")
    assert a.computed_chunks == 1 and a.token_ids == reference.token_ids
    assert "damaged cache" in caplog.text and "it will be recomputed" in caplog.text
    assert engine.store.get(key) is not None  # recomputed and stored again

    engine.store.path(key).unlink()  # a missing file is repaired by the next ingest
    res = ing.run([docs])
    assert res.repaired_caches == 1 and res.new_chunks == 0 and engine.store.path(key).exists()


def test_store_validation(tmp_path, gemma_lm):
    (tmp_path / "notastore").mkdir()
    (tmp_path / "notastore" / "thesis.tex").write_text("x")
    with pytest.raises(StoreError, match="is not a turborag store"):
        Catalog(tmp_path / "notastore", create=True)
    with pytest.raises(StoreError, match="no store at"):
        Catalog(tmp_path / "missing")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "catalog.sqlite").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a turborag catalog"):
        Catalog(tmp_path / "garbage")

    _setup(tmp_path / "store", gemma_lm)
    with pytest.raises(StoreError, match="was built with model tiny-gemma3"):
        Catalog(tmp_path / "store").check(StoreSettings(model="other", model_fingerprint="f" * 32))
    with pytest.raises(StoreError, match="chunk tokens 64, not 128"):
        Catalog(tmp_path / "store").bind(
            StoreSettings(model="tiny-gemma3", model_fingerprint=gemma_lm.fingerprint, chunk_tokens=128)
        )
    Catalog(tmp_path / "store").set_meta(schema="0")
    with pytest.raises(StoreError, match="format version 0/1; this turborag reads 2/1"):
        Catalog(tmp_path / "store")

    (tmp_path / "legacy" / "kv" / "ab").mkdir(parents=True)  # caches from before catalogs: adopted
    Catalog(tmp_path / "legacy", create=True)


@pytest.mark.parametrize("code, hint", [(errno.ENOSPC, "free some disk space"), (errno.EACCES, "writable")])
def test_write_error_keeps_store_readable(tmp_path, gemma_lm, monkeypatch, code, hint):
    docs = write_corpus(tmp_path / "docs")
    engine, catalog, ing = _setup(tmp_path / "store", gemma_lm, size=32, overlap=4)
    ing.group = 8  # commit often, so part of the corpus is in before the failure
    real_put, calls = KVStore.put, [0]

    def failing_put(self, key, value):
        calls[0] += 1
        if calls[0] > 20:
            raise OSError(code, os.strerror(code))
        return real_put(self, key, value)

    monkeypatch.setattr(KVStore, "put", failing_put)
    with pytest.raises(StoreWriteError) as err:
        ing.run([docs])
    msg = str(err.value)
    assert hint in msg and "run the same command again" in msg and "Everything ingested before" in msg
    kept = Catalog(tmp_path / "store").stats()
    assert 0 < kept["documents"] < 10
    assert Retriever(Catalog(tmp_path / "store"), Embedder()).search("harbour bell", 3)  # still readable
    monkeypatch.setattr(KVStore, "put", real_put)
    res = ing.run([docs])
    assert res.unchanged_documents == kept["documents"] and catalog.stats()["documents"] == 10


def test_retrieval_quality(tmp_path, gemma_lm):
    """The right document in the top 3 for most questions (MiniLM on a made-up corpus)."""
    docs = write_corpus(tmp_path / "docs")
    _, catalog, ing = _setup(tmp_path / "store", gemma_lm, size=256, overlap=32)
    ing.run([docs])
    retriever = Retriever(catalog, Embedder())
    hits = sum(any(p.path.endswith(name) for p in retriever.search(q, 3)) for q, name in QUESTIONS)
    assert hits >= 9, hits
    top1 = sum(retriever.search(q, 1)[0].path.endswith(name) for q, name in QUESTIONS)
    assert top1 >= 8, top1


def test_kill_and_resume(tmp_path, tiny_model_dir, computed):
    """kill -9 in the middle of an ingest: the store is consistent, and a rerun computes only what is left."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(12):
        for j, (name, text) in enumerate(CORPUS.items()):
            if j % 3 == i % 3:
                (docs / f"{i:02d}-{name}").write_text(f"Copy {i}. {text}")
    store = tmp_path / "store"
    args = [
        "ingest",
        str(docs),
        "--store",
        str(store),
        "--model",
        tiny_model_dir,
        "--chunk-tokens",
        "32",
        "--overlap",
        "4",
        "--json",
    ]
    # The child kills itself with SIGKILL when the engine starts its third forward group (two are stored).
    child = (
        "import os, signal, sys\n"
        "import turborag.core.kv as kv\n"
        "real, calls = kv.precompute_chunks, [0]\n"
        "def patched(*a, **k):\n"
        "    calls[0] += 1\n"
        "    if calls[0] == 3:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(*a, **k)\n"
        "kv.precompute_chunks = patched\n"
        "from turborag.cli import main\n"
        f"sys.argv = ['turborag'] + {args!r}\n"
        "main()\n"
    )
    env = {**os.environ, "TURBORAG_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr

    db = sqlite3.connect(store / "catalog.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    committed = db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    keys = [r[0] for r in db.execute("SELECT cache_key FROM chunks")]
    db.close()
    on_disk = {f.stem for f in _cache_files(store)}
    assert 0 < committed and set(keys) <= on_disk  # every cataloged chunk has its cache

    r = runner.invoke(app, args, env=env)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    total = Catalog(store).stats()
    assert out["chunks"] == total["chunks"] and out["new_chunks"] == total["chunks"] - committed
    assert len(computed) == total["cache_entries"] - len(on_disk)  # nothing stored before is recomputed


def test_kill_inside_a_group_loses_at_most_the_batch_in_flight(tmp_path, tiny_model_dir, computed):
    """kill -9 after three forward batches of the first group (whose documents are not committed yet): the
    three batches' caches are on disk, and the rerun computes only the rest and says how many it found."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, (name, text) in enumerate(CORPUS.items()):
        (docs / f"{i:02d}-{name}").write_text(text)
    store = tmp_path / "store"
    args = ["ingest", str(docs), "--store", str(store), "--model", tiny_model_dir, "--chunk-tokens", "16"]
    args += ["--overlap", "0", "--json"]
    child = (
        "import os, signal, sys\n"
        "import turborag.core.kv as kv\n"
        "real, batches = kv.precompute_chunks, [0]\n"
        "def patched(*a, on_batch=None, **k):\n"
        "    def counted(n, tokens):\n"
        "        batches[0] += 1\n"
        "        if batches[0] == 3:\n"
        "            os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(*a, on_batch=counted, **k)\n"
        "kv.precompute_chunks = patched\n"
        "from turborag.cli import main\n"
        f"sys.argv = ['turborag'] + {args!r}\n"
        "main()\n"
    )
    env = {**os.environ, "TURBORAG_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    batch = 4  # EngineOptions.batch_size: chunks per forward
    on_disk = len(_cache_files(store))
    assert on_disk == 3 * batch  # every batch stored as it ended; the first group (32) was not complete

    r = runner.invoke(app, args, env=env)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    total = Catalog(store).stats()["cache_entries"]
    assert total > 8 * batch and out["found_caches"] == on_disk
    assert len(computed) == total - on_disk  # nothing computed twice


def test_ingest_tokenizes_and_keys_each_chunk_once(tmp_path, gemma_lm, monkeypatch):
    """Ingest hands the engine the token ids and keys it made (Engine.precompute_ids), so a chunk is
    tokenized once, not again by the engine; and the progress it reports adds up to what it computed."""
    docs = write_corpus(tmp_path / "docs")
    engine, catalog, ing = _setup(tmp_path / "store", gemma_lm)
    calls = []
    real_ids, real_key = engine.layout.chunk_ids, engine.key
    monkeypatch.setattr(engine.layout, "chunk_ids", lambda text: calls.append("ids") or real_ids(text))
    monkeypatch.setattr(engine, "key", lambda ids, *scope: calls.append("key") or real_key(ids, *scope))
    advanced = []
    monkeypatch.setattr(ing.progress, "advance", lambda chunks, tokens: advanced.append((chunks, tokens)))
    res = ing.run([docs])
    assert res.chunks > 10 and calls.count("ids") == calls.count("key") == res.chunks
    assert sum(c for c, _ in advanced) == res.computed_chunks and sum(t for _, t in advanced) == res.tokens
