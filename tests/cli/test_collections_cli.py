"""`--collection` on ingest, ask, remove and cache stats; stores from before collections open unchanged."""

from __future__ import annotations

import sqlite3

from helpers import cli_json
from typer.testing import CliRunner

from turborag.cli import app
from turborag.store import kv_store
from turborag.store.catalog import Catalog

runner = CliRunner()
RED = "The lighthouse of Velmora is painted red and its keeper is called Odrun Pask."
BLUE = "The lighthouse of Velmora is painted blue and its keeper is called Mirel Tosk."


def _folder(root, name: str, text: str):
    folder = root / name
    folder.mkdir()
    (folder / f"{name}.md").write_text(f"# Lighthouse\n\n{text}\n")
    return folder


def test_collections_on_the_command_line(env, tiny_model_dir):
    red, blue = _folder(env, "red", RED), _folder(env, "blue", BLUE)
    base = ["--model", tiny_model_dir, "--chunk-tokens", "64", "--json"]
    a = cli_json(runner.invoke(app, ["ingest", str(red), "--collection", "red", *base]))
    b = cli_json(runner.invoke(app, ["ingest", str(blue), "-c", "blue", *base]))
    assert a["new_chunks"] >= 1 and b["new_chunks"] >= 1
    for name in ("red", "blue"):  # each answers from its own documents only
        out = cli_json(
            runner.invoke(app, ["ask", "What colour is the lighthouse?", "-c", name, "--local", "--json"])
        )
        assert out["chunks"] and all(c.split("#")[0].endswith(f"{name}.md") for c in out["chunks"])
    red_stats = cli_json(runner.invoke(app, ["cache", "stats", "-c", "red", "--json"]))
    assert red_stats["collection"] == "red" and red_stats["documents"] == 1
    assert set(red_stats["collections"]) == {"default", "red", "blue"}
    # the same file in a second collection: its caches are already there, nothing is computed
    again = cli_json(runner.invoke(app, ["ingest", str(red), "-c", "blue", "--json"]))
    assert again["new_chunks"] >= 1 and again["tokens"] == 0
    blue_stats = cli_json(runner.invoke(app, ["cache", "stats", "-c", "blue", "--json"]))
    assert blue_stats["documents"] == 2 and blue_stats["orphan_files"] == 0
    # removing it from blue keeps red's copy and its caches
    gone = cli_json(runner.invoke(app, ["remove", str(red), "-c", "blue", "--json"]))
    assert gone["documents"] == 1
    red_after = cli_json(runner.invoke(app, ["cache", "stats", "-c", "red", "--json"]))
    assert red_after["documents"] == 1 and red_after["missing_caches"] == 0
    # the default collection is empty, so asking it is one clear error
    r = runner.invoke(app, ["ask", "What colour?", "--local"])
    assert r.exit_code == 2 and "has no chunks" in r.output


def test_collection_errors_are_one_line(env, tiny_model_dir):
    red = _folder(env, "red", RED)
    r = runner.invoke(app, ["ingest", str(red), "-c", "bad/name", "--model", tiny_model_dir])
    assert r.exit_code == 2 and "invalid collection name" in r.output
    assert not (env / "home" / "store").exists()  # no store was made for it
    cli_json(runner.invoke(app, ["ingest", str(red), "--model", tiny_model_dir, "--json"]))
    for cmd in (["ask", "q", "--local"], ["remove", str(red)], ["cache", "stats"]):
        r = runner.invoke(app, [*cmd, "-c", "nope"])
        assert r.exit_code == 2 and "no collection 'nope'" in r.output and "Traceback" not in r.output


V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE documents (id INTEGER PRIMARY KEY, doc_id TEXT NOT NULL UNIQUE, path TEXT NOT NULL,
    file_hash TEXT NOT NULL, content_hash TEXT NOT NULL, ingested REAL NOT NULL);
CREATE INDEX documents_path ON documents(path);
CREATE TABLE chunks (id INTEGER PRIMARY KEY AUTOINCREMENT, chunk_id TEXT NOT NULL UNIQUE,
    document INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE, ordinal INTEGER NOT NULL,
    text TEXT NOT NULL, tokens INTEGER NOT NULL, hash TEXT NOT NULL, cache_key TEXT NOT NULL,
    embedding BLOB NOT NULL);
CREATE INDEX chunks_document ON chunks(document);
CREATE INDEX chunks_cache_key ON chunks(cache_key);
CREATE TABLE cache_entries (key TEXT PRIMARY KEY, bytes INTEGER NOT NULL, created REAL NOT NULL);
"""


def test_a_store_from_before_collections_opens_as_default(tmp_path):
    """A schema-1 catalog (as turborag wrote it before collections) is migrated in place: its documents
    are the collection `default`, row ids (which the index snapshot names) kept."""
    root = tmp_path / "old"
    root.mkdir()
    db = sqlite3.connect(root / "catalog.sqlite")
    db.executescript(V1_SCHEMA)
    meta = {"format": "turborag-store", "schema": "1", "kv_format": kv_store.KEY_VERSION, "generation": "4"}
    db.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
    db.execute("INSERT INTO documents VALUES (1, '/d/a.md', '/d/a.md', 'f', 'c', 0)")
    db.execute("INSERT INTO chunks VALUES (7, '/d/a.md#0:x', 1, 0, 'hello', 3, 'h', 'k1', x'00')")
    db.execute("INSERT INTO cache_entries VALUES ('k1', 10, 0)")
    db.commit()
    db.close()
    cat = Catalog(root)
    assert cat.meta()["schema"] == "2" and cat.collections() == ["default"]
    assert cat.stats()["documents"] == 1 and cat.embeddings()[0] == [7]
    other = cat.use("other", create=True)  # the same document in a second collection is allowed now
    assert other.stats()["documents"] == 0 and cat.documents_by_path("/d/a.md")
    cat.close()
    assert Catalog(root).meta()["generation"] == "4"  # opened again: nothing migrated twice
