"""The store directory and its SQLite catalog: what was ingested, with which model, and where the caches are.

A store directory holds

    catalog.sqlite        this catalog: meta, documents, chunks (text, tokens, hash, cache key, embedding),
                          cache_entries (key, bytes, created)
    kv/ab/<key>.safetensors   chunk KV caches (kv_store.py: atomic writes, hash-checked reads)
    index.safetensors     snapshot of the embedding matrix for fast loading (rag/embed.py), tagged with the
                          catalog's generation and rebuilt from the catalog whenever it is stale
    lock                  held by a writer (ingest, remove, gc) so two writers never interleave

The catalog is the source of truth. Ingest commits one document per transaction, *after* its caches are on
disk, so at any instant (including after kill -9) every chunk in the catalog has had its cache written,
and a cache file the catalog does not know is an orphan that resume reuses or `cache gc` removes.

`meta` records the store format, the model's fingerprint (every cache was computed by that model), its
`--model` spec, the prompt template, the cache dtype and the chunking parameters; a store is never used
with a different model or format.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from turborag.store import kv_store

CATALOG = "catalog.sqlite"
STORE_FORMAT = "turborag-store"
SCHEMA_VERSION = "1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS documents (
    id INTEGER PRIMARY KEY,
    doc_id TEXT NOT NULL UNIQUE,        -- absolute path, or path#record-id for JSONL
    path TEXT NOT NULL,                 -- the source file
    file_hash TEXT NOT NULL,            -- sha256 of the source file's bytes
    content_hash TEXT NOT NULL,         -- sha256 of the extracted text
    ingested REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS documents_path ON documents(path);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- the index's row id
    chunk_id TEXT NOT NULL UNIQUE,      -- doc_id#ordinal:hash12
    document INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    text TEXT NOT NULL,
    tokens INTEGER NOT NULL,            -- serving-model tokens of the text
    hash TEXT NOT NULL,                 -- sha256 of the text
    cache_key TEXT NOT NULL,
    embedding BLOB NOT NULL             -- float32 unit vector
);
CREATE INDEX IF NOT EXISTS chunks_document ON chunks(document);
CREATE INDEX IF NOT EXISTS chunks_cache_key ON chunks(cache_key);
CREATE TABLE IF NOT EXISTS cache_entries (
    key TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL,
    created REAL NOT NULL
);
"""


class StoreError(Exception):
    """A store that cannot be used as asked; the message says why and what to do."""


@dataclass
class ChunkRow:
    rowid: int
    chunk_id: str
    doc_id: str
    path: str
    ordinal: int
    text: str
    tokens: int
    cache_key: str


@dataclass
class NewChunk:
    chunk_id: str
    ordinal: int
    text: str
    tokens: int
    hash: str
    cache_key: str
    embedding: bytes  # float32 (384,) as bytes
    cache_bytes: int


# ---------------------------------------------------------------------------------------------------------
# opening


def _legacy_or_empty(root: Path) -> bool:
    """An empty folder, or one holding only caches (`kv/`) from a turborag without catalogs: safe to adopt,
    since cache files are content-addressed and never served to the wrong model."""
    return all(p.name == "kv" and p.is_dir() for p in root.iterdir())


def is_store(root: Path) -> bool:
    return (Path(root) / CATALOG).is_file()


def _outermost_missing(path: Path) -> Path | None:
    """The highest folder of `path` (itself included) that does not exist yet: what mkdir(parents=True)
    creates. None if `path` exists."""
    out = None
    while not path.exists():
        out, path = path, path.parent
    return out


class Catalog:
    def __init__(self, root: str | Path, create: bool = False):
        self.root = Path(root).expanduser()
        self.path = self.root / CATALOG
        # Set when this Catalog creates the store, so that `discard` can take back exactly what it made.
        self._created: tuple[Path | None, set[str]] | None = None
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"--store {self.root} is a file, not a store directory")
        if not self.path.is_file():
            if not create:
                if self.root.exists() and any(self.root.iterdir()):
                    raise StoreError(f"{self.root} is not a turborag store (it has no {CATALOG})")
                raise StoreError(
                    f"no store at {self.root}: run `turborag ingest PATH --store {self.root}` first"
                )
            if self.root.exists() and not _legacy_or_empty(self.root):
                raise StoreError(
                    f"{self.root} is not a turborag store (no {CATALOG}) and is not empty: "
                    "pass a new or empty folder to --store"
                )
            before = set(os.listdir(self.root)) if self.root.exists() else set()
            self._created = (_outermost_missing(self.root), before)
            self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)  # explicit transactions
            self.db.execute("PRAGMA foreign_keys = ON")
            if create:
                self.db.executescript(_SCHEMA)
            tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path} is not a turborag catalog ({e})") from e
        if "meta" not in tables:
            raise StoreError(f"{self.path} is not a turborag catalog (no meta table)")
        meta = self.meta()
        if not meta:
            self.set_meta(
                format=STORE_FORMAT, schema=SCHEMA_VERSION, kv_format=kv_store.KEY_VERSION, generation="0"
            )
            meta = self.meta()
        if meta.get("format") != STORE_FORMAT:
            raise StoreError(f"{self.path} is not a turborag catalog")
        found = (meta.get("schema"), meta.get("kv_format"))
        if found != (SCHEMA_VERSION, kv_store.KEY_VERSION):
            raise StoreError(
                f"store {self.root} has format version {found[0]}/{found[1]}; this turborag reads "
                f"{SCHEMA_VERSION}/{kv_store.KEY_VERSION}. Ingest again into a new --store."
            )

    def close(self) -> None:
        self.db.close()

    def discard(self) -> bool:
        """Delete the store again if this Catalog created it and it still holds no document; True if it did.

        An ingest that finds nothing must not leave an empty store behind: besides being clutter, a new store
        records its model and chunking when first opened for ingest, so an empty one would refuse the settings
        of the user's next, real ingest. Only what this Catalog created goes: the files it added to the
        folder, empty folders it added, and the folder itself (and its parents) if it made them and they are
        empty now. An existing store, or one another writer holds, is never touched. Closes the catalog
        either way."""
        if self._created is None:
            self.close()
            return False
        outermost, before = self._created
        try:
            with self.write_lock():  # no other writer mid-ingest; under the lock, no document means none
                if self.stats()["documents"]:
                    return False
                self.close()
                for name in set(os.listdir(self.root)) - before:
                    p = self.root / name
                    if not p.is_dir() or p.is_symlink():  # the lock too: flock holds the open file
                        p.unlink(missing_ok=True)
                    elif not any(p.iterdir()):
                        p.rmdir()
        except (StoreError, OSError):
            return False
        finally:
            self.close()
        d = self.root
        while outermost is not None:  # the folders this Catalog made, innermost first, while they are empty
            try:
                d.rmdir()
            except OSError:
                break
            if d == outermost:
                break
            d = d.parent
        self._created = None
        return True

    # -- meta ------------------------------------------------------------------------------------------

    def meta(self) -> dict[str, str]:
        return dict(self.db.execute("SELECT key, value FROM meta"))

    def set_meta(self, **values) -> None:
        with self.transaction():
            self.db.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [(k, str(v)) for k, v in values.items()],
            )

    @property
    def generation(self) -> int:
        return int(self.meta().get("generation", "0"))

    def bind(self, model: str, fingerprint: str, **settings) -> None:
        """Record the store's model and settings on first use; later, refuse a different model or settings."""
        if "model_fingerprint" not in self.meta():
            self.set_meta(model=model, model_fingerprint=fingerprint, **settings)
        self.check(model, fingerprint, **settings)

    def check(self, model: str, fingerprint: str, **settings) -> None:
        """StoreError unless this store was built with these settings and this model (by fingerprint)."""
        self.check_settings(**settings)  # first: a setting like the dtype also changes the fingerprint
        meta = self.meta()
        if meta.get("model_fingerprint") != fingerprint:
            raise StoreError(
                f"store {self.root} was built with model {meta.get('model')} (fingerprint "
                f"{meta.get('model_fingerprint', '?')[:12]}), not {model} (fingerprint {fingerprint[:12]}): "
                "its caches are useless to this model. Use the store's model, or another --store."
            )

    def check_settings(self, **settings) -> None:
        """StoreError if a setting the store recorded differs (settings it never recorded are not checked)."""
        meta = self.meta()
        for k, v in settings.items():
            if k in meta and meta[k] != str(v):
                raise StoreError(
                    f"store {self.root} uses {k.replace('_', ' ')} {meta[k]}, not {v}: "
                    f"use {meta[k]} with this store, or another --store"
                )

    # -- transactions and locking ------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    @contextmanager
    def write_lock(self) -> Iterator[None]:
        """One writer at a time (ingest, remove, gc); readers (ask, stats) never wait."""
        with open(self.root / "lock", "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    raise StoreError(
                        f"another turborag process is writing to {self.root}; wait for it"
                    ) from e
                raise
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # -- documents ---------------------------------------------------------------------------------

    def documents_by_path(self, path: str) -> dict[str, tuple[str, str]]:
        """doc_id -> (file_hash, content_hash) of the documents from one source file."""
        rows = self.db.execute(
            "SELECT doc_id, file_hash, content_hash FROM documents WHERE path = ?", (path,)
        )
        return {d: (f, c) for d, f, c in rows}

    def paths(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT path FROM documents ORDER BY path")]

    def chunk_ids(self, doc_ids: Iterable[str]) -> set[str]:
        out: set[str] = set()
        for d in doc_ids:
            q = "SELECT c.chunk_id FROM chunks c JOIN documents d ON c.document = d.id WHERE d.doc_id = ?"
            out.update(r[0] for r in self.db.execute(q, (d,)))
        return out

    def cache_keys_of(self, doc_ids: Iterable[str]) -> list[tuple[str, str, int]]:
        """(doc_id, cache_key, tokens) of every chunk of these documents."""
        out = []
        q = (
            "SELECT d.doc_id, c.cache_key, c.tokens FROM chunks c JOIN documents d ON c.document = d.id "
            "WHERE d.doc_id = ? ORDER BY c.ordinal"
        )
        for d in doc_ids:
            out.extend(self.db.execute(q, (d,)))
        return out

    def touch_document(self, doc_id: str, file_hash: str) -> None:
        """Same text, new file bytes (e.g. another JSONL record changed): only the file hash moves."""
        with self.transaction() as db:
            db.execute("UPDATE documents SET file_hash = ? WHERE doc_id = ?", (file_hash, doc_id))

    def replace_document(
        self, doc_id: str, path: str, file_hash: str, content_hash: str, chunks: list[NewChunk]
    ) -> tuple[int, int]:
        """Put a document's new chunks in place of its old ones, in one transaction.

        Returns (new, removed): chunk ids that were not in the catalog before / old ids no longer present.
        """
        with self.transaction() as db:
            old = {
                r[0]
                for r in db.execute(
                    "SELECT c.chunk_id FROM chunks c JOIN documents d ON c.document = d.id "
                    "WHERE d.doc_id = ?",
                    (doc_id,),
                )
            }
            db.execute("DELETE FROM documents WHERE doc_id = ?", (doc_id,))  # cascades to its chunks
            cur = db.execute(
                "INSERT INTO documents(doc_id, path, file_hash, content_hash, ingested) "
                "VALUES (?, ?, ?, ?, ?)",
                (doc_id, path, file_hash, content_hash, time.time()),
            )
            doc = cur.lastrowid
            now = time.time()
            db.executemany(
                "INSERT INTO chunks(chunk_id, document, ordinal, text, tokens, hash, cache_key, embedding) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (c.chunk_id, doc, c.ordinal, c.text, c.tokens, c.hash, c.cache_key, c.embedding)
                    for c in chunks
                ],
            )
            db.executemany(
                "INSERT INTO cache_entries(key, bytes, created) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET bytes = excluded.bytes",
                [(c.cache_key, c.cache_bytes, now) for c in chunks],
            )
            self._bump(db)
        new_ids = {c.chunk_id for c in chunks}
        return len(new_ids - old), len(old - new_ids)

    def remove_documents(self, doc_ids: Iterable[str]) -> int:
        """Drop documents and their chunks in one transaction; returns the number of chunks removed."""
        doc_ids = list(doc_ids)
        if not doc_ids:
            return 0
        removed = 0
        with self.transaction() as db:
            for d in doc_ids:
                removed += db.execute(
                    "SELECT COUNT(*) FROM chunks c JOIN documents d ON c.document = d.id WHERE d.doc_id = ?",
                    (d,),
                ).fetchone()[0]
                db.execute("DELETE FROM documents WHERE doc_id = ?", (d,))
            self._bump(db)
        return removed

    def documents_under(self, path: str) -> list[str]:
        """doc_ids whose source file is `path` or lies under the folder `path`."""
        prefix = path.rstrip(os.sep) + os.sep
        rows = self.db.execute(
            "SELECT doc_id FROM documents WHERE path = ? OR substr(path, 1, ?) = ?",
            (path, len(prefix), prefix),
        )
        return [r[0] for r in rows]

    @staticmethod
    def _bump(db: sqlite3.Connection) -> None:
        db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'generation'")

    # -- caches --------------------------------------------------------------------------------------

    def drop_unreferenced_entries(self) -> list[str]:
        """Delete cache entries no chunk refers to any more; returns their keys (the caller deletes files
        after this commit, so a crash in between leaves only orphan files, never a dangling entry)."""
        with self.transaction() as db:
            keys = [
                r[0]
                for r in db.execute(
                    "SELECT key FROM cache_entries WHERE key NOT IN (SELECT cache_key FROM chunks)"
                )
            ]
            db.executemany("DELETE FROM cache_entries WHERE key = ?", [(k,) for k in keys])
        return keys

    def sample_chunk(self) -> tuple[str, str] | None:
        """(text, cache key) of one chunk, or None for an empty store: enough to check that an engine
        computes the keys this store was built with."""
        return self.db.execute("SELECT text, cache_key FROM chunks ORDER BY id LIMIT 1").fetchone()

    def texts_of_keys(self, keys: list[str]) -> dict[str, str]:
        """key -> the text of a chunk that uses it (for recomputing missing caches)."""
        q = "SELECT text FROM chunks WHERE cache_key = ? LIMIT 1"
        rows = ((k, self.db.execute(q, (k,)).fetchone()) for k in keys)
        return {k: row[0] for k, row in rows if row}

    def cache_entries(self) -> list[tuple[str, int]]:
        return list(self.db.execute("SELECT key, bytes FROM cache_entries ORDER BY key"))

    def set_cache_bytes(self, key: str, nbytes: int) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE cache_entries SET bytes = ?, created = ? WHERE key = ?", (nbytes, time.time(), key)
            )

    # -- retrieval -------------------------------------------------------------------------------------

    def embeddings(self) -> tuple[list[int], list[bytes]]:
        rows = self.db.execute("SELECT id, embedding FROM chunks ORDER BY id").fetchall()
        return [r[0] for r in rows], [r[1] for r in rows]

    def chunks_by_rowid(self, rowids: list[int]) -> list[ChunkRow]:
        """Rows in the order asked for (missing ids are left out)."""
        q = (
            "SELECT c.id, c.chunk_id, d.doc_id, d.path, c.ordinal, c.text, c.tokens, c.cache_key "
            "FROM chunks c JOIN documents d ON c.document = d.id WHERE c.id = ?"
        )
        out = []
        for r in rowids:
            row = self.db.execute(q, (r,)).fetchone()
            if row:
                out.append(ChunkRow(*row))
        return out

    def stats(self) -> dict:
        """What the catalog records. `tokens` are the chunks' text alone, every chunk counted (not the prompt
        form "Passage: ...", which ingest counts). `cache_entries` / `cache_bytes` are the caches the catalog
        names, whether or not their file is still on disk: a file `cache verify` removed keeps its entry until
        the next ingest recomputes it, so `cache stats` compares them with the files present."""
        one = lambda q: self.db.execute(q).fetchone()[0]  # noqa: E731
        return {
            "documents": one("SELECT COUNT(*) FROM documents"),
            "files": one("SELECT COUNT(DISTINCT path) FROM documents"),
            "chunks": one("SELECT COUNT(*) FROM chunks"),
            "tokens": one("SELECT COALESCE(SUM(tokens), 0) FROM chunks"),
            "cache_entries": one("SELECT COUNT(*) FROM cache_entries"),
            "cache_bytes": one("SELECT COALESCE(SUM(bytes), 0) FROM cache_entries"),
        }
