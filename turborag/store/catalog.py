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

import copy
import errno
import fcntl
import os
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from turborag.store.settings import StoreSettings

CATALOG = "catalog.sqlite"
STORE_FORMAT = "turborag-store"
SCHEMA_VERSION = "2"
DEFAULT_COLLECTION = "default"
COLLECTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

# Version 2 added collections: a document belongs to one collection (the same file may be in several), and
# chunk ids are unique per document only. Chunks still name their cache by content, so cache entries stay
# shared by every collection. A version-1 store is migrated in place when opened (`_migrate_v1`): its
# documents become the collection `default`.
_TABLES = """
CREATE TABLE IF NOT EXISTS collections (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS {documents} (
    id INTEGER PRIMARY KEY,
    collection INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    doc_id TEXT NOT NULL,               -- absolute path, or path#record-id for JSONL
    path TEXT NOT NULL,                 -- the source file
    file_hash TEXT NOT NULL,            -- sha256 of the source file's bytes
    content_hash TEXT NOT NULL,         -- sha256 of the extracted text
    ingested REAL NOT NULL,
    UNIQUE (collection, doc_id)
);
CREATE TABLE IF NOT EXISTS {chunks} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- the index's row id
    chunk_id TEXT NOT NULL,             -- doc_id#ordinal:hash12
    document INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    text TEXT NOT NULL,
    tokens INTEGER NOT NULL,            -- serving-model tokens of the text
    hash TEXT NOT NULL,                 -- sha256 of the text
    cache_key TEXT NOT NULL,
    embedding BLOB NOT NULL             -- float32 unit vector
);
"""
_INDEXES = """
CREATE INDEX IF NOT EXISTS documents_path ON documents(collection, path);
CREATE INDEX IF NOT EXISTS chunks_document ON chunks(document);
CREATE INDEX IF NOT EXISTS chunks_cache_key ON chunks(cache_key);
"""
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);\n"
    + _TABLES.format(documents="documents", chunks="chunks")
    + _INDEXES
    + "CREATE TABLE IF NOT EXISTS cache_entries (key TEXT PRIMARY KEY, bytes INTEGER NOT NULL, "
    "created REAL NOT NULL);\n"
)


class StoreError(Exception):
    """A store that cannot be used as asked; the message says why and what to do."""


def check_collection_name(name: str) -> str:
    """StoreError unless `name` is a collection name: letters, digits, `_` and `-`, at most 64, starting with
    a letter or digit (so it is safe in a file name and a URL)."""
    if not isinstance(name, str) or not COLLECTION_NAME.fullmatch(name):
        raise StoreError(
            f"invalid collection name {name!r}: use 1-64 letters, digits, '_' or '-', starting with a letter "
            "or digit"
        )
    return name


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
    def __init__(self, root: str | Path, create: bool = False, read_only: bool = False):
        if create and read_only:
            raise ValueError("a read-only catalog cannot create a store")
        self.root = Path(root).expanduser()
        self.read_only = read_only  # SQLite's mode=ro: a serving replica can never write the catalog
        self.path = self.root / CATALOG
        # Set when this Catalog creates the store, so that `discard` can take back exactly what it made.
        self._created: tuple[Path | None, set[str]] | None = None
        self._prepare_root(create)
        self.db = self._connect(create, read_only)
        self.collection = DEFAULT_COLLECTION
        self._collection_id: int | None = None
        self._check_format()

    def _prepare_root(self, create: bool) -> None:
        """The store's folder: made when `create` (remembering what was there, for `discard`); a missing
        store, a file, or a folder of something else is a StoreError that says what to do."""
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"--store {self.root} is a file, not a store directory")
        if self.path.is_file():
            return
        if not create:
            if self.root.exists() and any(self.root.iterdir()):
                raise StoreError(f"{self.root} is not a turborag store (it has no {CATALOG})")
            raise StoreError(f"no store at {self.root}: run `turborag ingest PATH --store {self.root}` first")
        if self.root.exists() and not _legacy_or_empty(self.root):
            raise StoreError(
                f"{self.root} is not a turborag store (no {CATALOG}) and is not empty: "
                "pass a new or empty folder to --store"
            )
        before = set(os.listdir(self.root)) if self.root.exists() else set()
        self._created = (_outermost_missing(self.root), before)
        self.root.mkdir(parents=True, exist_ok=True)

    def _connect(self, create: bool, read_only: bool) -> sqlite3.Connection:
        """The SQLite connection (explicit transactions), the schema made when `create`, a version-1 store
        migrated; StoreError for a file that is not a catalog."""
        try:
            # A server's upload runs its ingest in a helper thread that takes turns with the model worker
            # (serve/turns.py): one thread at a time, but not always the one that opened the connection.
            if read_only:
                uri = f"{self.path.resolve().as_uri()}?mode=ro"
                db = sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None, check_same_thread=False)
            else:
                db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            self.db = db
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            old = self.meta() if "meta" in tables and "collections" not in tables else {}
            if old.get("format") == STORE_FORMAT and old.get("schema") == "1":
                try:
                    self._migrate_v1()
                except sqlite3.OperationalError as e:  # e.g. a read-only store
                    raise StoreError(
                        f"store {self.root} predates collections and must be upgraded once, which needs "
                        f"write access ({e}): run any turborag command on it as a user who can write it"
                    ) from e
            db.execute("PRAGMA foreign_keys = ON")
            if create:
                db.executescript(_SCHEMA)
                db.execute(
                    "INSERT OR IGNORE INTO collections(name, created) VALUES (?, ?)",
                    (DEFAULT_COLLECTION, time.time()),
                )
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path} is not a turborag catalog ({e})") from e
        if "meta" not in tables:
            raise StoreError(f"{self.path} is not a turborag catalog (no meta table)")
        return db

    def _check_format(self) -> None:
        """A new catalog gets the current format; another format version is refused (ingest anew)."""
        # kv_store imports torch: here, not at the top, so that a missing store is one quick error line
        from turborag.store import kv_store

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

    def _migrate_v1(self) -> None:
        """Version 1 -> 2 in one transaction: every document goes to the collection `default`, and the
        uniqueness of doc_id and chunk_id becomes per collection. SQLite cannot drop a UNIQUE constraint,
        so both tables are copied into new ones (row ids kept: the index snapshot names chunks by them)."""
        db = self.db
        db.execute("PRAGMA foreign_keys = OFF")  # the copy drops and renames the tables chunks refer to
        db.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _TABLES.format(documents="documents_v2", chunks="chunks_v2").split(";"):
                if stmt.strip():
                    db.execute(stmt)
            db.execute(
                "INSERT INTO collections(id, name, created) VALUES (1, ?, ?)",
                (DEFAULT_COLLECTION, time.time()),
            )
            db.execute(
                "INSERT INTO documents_v2(id, collection, doc_id, path, file_hash, content_hash, ingested) "
                "SELECT id, 1, doc_id, path, file_hash, content_hash, ingested FROM documents"
            )
            db.execute("INSERT INTO chunks_v2 SELECT * FROM chunks")
            db.execute("DROP TABLE chunks")
            db.execute("DROP TABLE documents")
            db.execute("ALTER TABLE documents_v2 RENAME TO documents")
            db.execute("ALTER TABLE chunks_v2 RENAME TO chunks")
            for stmt in _INDEXES.split(";"):
                if stmt.strip():
                    db.execute(stmt)
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (SCHEMA_VERSION,))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()

    # -- collections -------------------------------------------------------------------------------

    def use(self, name: str, create: bool = False) -> Catalog:
        """This catalog seen through collection `name` (the same connection): documents, chunks, retrieval
        and stats are that collection's; cache entries stay the store's. StoreError if the collection does
        not exist and `create` is false, or the name is not a valid collection name."""
        check_collection_name(name)
        row = self.db.execute("SELECT id FROM collections WHERE name = ?", (name,)).fetchone()
        if row is None:
            if not create:
                raise StoreError(
                    f"no collection {name!r} in this store (it has {', '.join(self.collections())})"
                )
            self.create_collection(name)
            row = self.db.execute("SELECT id FROM collections WHERE name = ?", (name,)).fetchone()
        view = copy.copy(self)  # shares the connection, and `discard` of a store this run created
        view.collection, view._collection_id = name, row[0]
        return view

    @property
    def cid(self) -> int:
        """The id of this view's collection (`default` unless `use` chose another)."""
        if self._collection_id is None:
            row = self.db.execute("SELECT id FROM collections WHERE name = ?", (self.collection,)).fetchone()
            if row is None:
                raise StoreError(f"no collection {self.collection!r} in this store")
            self._collection_id = row[0]
        return self._collection_id

    def collections(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT name FROM collections ORDER BY name")]

    def has_collection(self, name: str) -> bool:
        return self.db.execute("SELECT 1 FROM collections WHERE name = ?", (name,)).fetchone() is not None

    def create_collection(self, name: str) -> bool:
        """Create an empty collection; False if it already exists."""
        check_collection_name(name)
        with self.transaction() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO collections(name, created) VALUES (?, ?)", (name, time.time())
            )
        return cur.rowcount == 1

    def delete_collection(self, name: str) -> list[str] | None:
        """Drop a collection with its documents and chunks (one transaction); returns the source paths of
        its documents, or None if there is no such collection. The caller frees the caches nothing else uses
        (`drop_unreferenced_entries`), as after any removal."""
        with self.transaction() as db:
            row = db.execute("SELECT id FROM collections WHERE name = ?", (name,)).fetchone()
            if row is None:
                return None
            paths = [
                r[0] for r in db.execute("SELECT DISTINCT path FROM documents WHERE collection = ?", row)
            ]
            db.execute("DELETE FROM collections WHERE id = ?", row)  # cascades to documents and chunks
            self._bump(db)
        return paths

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
                if self.db.execute("SELECT COUNT(*) FROM documents").fetchone()[0]:
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

    def settings(self) -> StoreSettings:
        """What the store is bound to (store/settings.py), typed."""
        return StoreSettings.from_meta(self.meta())

    def record(self, **values) -> None:
        """Record settings that come after the first bind (the disk cap, where the caches live), by their
        StoreSettings names, checked as those are."""
        self.set_meta(**StoreSettings(**values).as_meta())

    def bind(self, settings: StoreSettings) -> None:
        """Record the store's model and settings on first use; later, refuse a different model or settings."""
        if not self.settings().bound:
            self.set_meta(**settings.as_meta())
        self.check(settings)

    def check(self, settings: StoreSettings) -> None:
        """StoreError if a setting the store recorded differs from one given (settings it never recorded, or
        not given, are not checked), or if a model fingerprint is given and is not the store's."""
        recorded = self.settings()
        for name, ours, theirs in recorded.differences(settings):
            if name not in ("model", "model_fingerprint"):  # first: the dtype also changes the fingerprint
                raise StoreError(
                    f"store {self.root} uses {name.replace('_', ' ')} {ours}, not {theirs}: "
                    f"use {ours} with this store, or another --store"
                )
        fingerprint = settings.model_fingerprint
        if fingerprint is not None and recorded.model_fingerprint != fingerprint:
            raise StoreError(
                f"store {self.root} was built with model {recorded.model} (fingerprint "
                f"{(recorded.model_fingerprint or '?')[:12]}), not {settings.model} (fingerprint "
                f"{fingerprint[:12]}): its caches are useless to this model. Use the store's model, or "
                "another --store."
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
            "SELECT doc_id, file_hash, content_hash FROM documents WHERE collection = ? AND path = ?",
            (self.cid, path),
        )
        return {d: (f, c) for d, f, c in rows}

    def paths(self) -> list[str]:
        q = "SELECT DISTINCT path FROM documents WHERE collection = ? ORDER BY path"
        return [r[0] for r in self.db.execute(q, (self.cid,))]

    def chunk_ids(self, doc_ids: Iterable[str]) -> set[str]:
        out: set[str] = set()
        for d in doc_ids:
            q = (
                "SELECT c.chunk_id FROM chunks c JOIN documents d ON c.document = d.id "
                "WHERE d.collection = ? AND d.doc_id = ?"
            )
            out.update(r[0] for r in self.db.execute(q, (self.cid, d)))
        return out

    def cache_keys_of(self, doc_ids: Iterable[str]) -> list[tuple[str, str, int]]:
        """(doc_id, cache_key, tokens) of every chunk of these documents."""
        out = []
        q = (
            "SELECT d.doc_id, c.cache_key, c.tokens FROM chunks c JOIN documents d ON c.document = d.id "
            "WHERE d.collection = ? AND d.doc_id = ? ORDER BY c.ordinal"
        )
        for d in doc_ids:
            out.extend(self.db.execute(q, (self.cid, d)))
        return out

    def touch_document(self, doc_id: str, file_hash: str) -> None:
        """Same text, new file bytes (e.g. another JSONL record changed): only the file hash moves."""
        with self.transaction() as db:
            db.execute(
                "UPDATE documents SET file_hash = ? WHERE collection = ? AND doc_id = ?",
                (file_hash, self.cid, doc_id),
            )

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
                    "WHERE d.collection = ? AND d.doc_id = ?",
                    (self.cid, doc_id),
                )
            }
            # cascades to its chunks
            db.execute("DELETE FROM documents WHERE collection = ? AND doc_id = ?", (self.cid, doc_id))
            cur = db.execute(
                "INSERT INTO documents(collection, doc_id, path, file_hash, content_hash, ingested) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (self.cid, doc_id, path, file_hash, content_hash, time.time()),
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
                    "SELECT COUNT(*) FROM chunks c JOIN documents d ON c.document = d.id "
                    "WHERE d.collection = ? AND d.doc_id = ?",
                    (self.cid, d),
                ).fetchone()[0]
                db.execute("DELETE FROM documents WHERE collection = ? AND doc_id = ?", (self.cid, d))
            self._bump(db)
        return removed

    def documents_under(self, path: str) -> list[str]:
        """doc_ids whose source file is `path` or lies under the folder `path`."""
        prefix = path.rstrip(os.sep) + os.sep
        rows = self.db.execute(
            "SELECT doc_id FROM documents WHERE collection = ? AND (path = ? OR substr(path, 1, ?) = ?)",
            (self.cid, path, len(prefix), prefix),
        )
        return [r[0] for r in rows]

    def doc_ids(self) -> list[str]:
        """Every document id of this collection."""
        rows = self.db.execute("SELECT doc_id FROM documents WHERE collection = ?", (self.cid,))
        return [r[0] for r in rows]

    def document_rows(self) -> list[tuple[str, str, int, int]]:
        """(doc_id, path, chunks, tokens) of every document of this collection, oldest first."""
        return self.db.execute(
            "SELECT d.doc_id, d.path, COUNT(c.id), COALESCE(SUM(c.tokens), 0) FROM documents d "
            "LEFT JOIN chunks c ON c.document = d.id WHERE d.collection = ? "
            "GROUP BY d.id ORDER BY d.ingested",
            (self.cid,),
        ).fetchall()

    def any_document_under(self, path: str) -> bool:
        """Whether a document of any collection has its source file at `path` or under the folder `path`
        (`cache gc` keeps such an upload folder)."""
        prefix = path.rstrip(os.sep) + os.sep
        row = self.db.execute(
            "SELECT 1 FROM documents WHERE path = ? OR substr(path, 1, ?) = ? LIMIT 1",
            (path, len(prefix), prefix),
        ).fetchone()
        return row is not None

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

    def referenced_keys(self, keys: Iterable[str]) -> set[str]:
        """Those of `keys` that a chunk of this collection uses (another collection's chunks do not count)."""
        keys = list(dict.fromkeys(keys))
        found: set[str] = set()
        for s in range(0, len(keys), 500):  # below SQLite's limit of bound variables
            part = keys[s : s + 500]
            q = (
                "SELECT DISTINCT c.cache_key FROM chunks c JOIN documents d ON c.document = d.id "
                f"WHERE d.collection = ? AND c.cache_key IN ({','.join('?' * len(part))})"
            )
            found.update(r[0] for r in self.db.execute(q, (self.cid, *part)))
        return found

    def keys_in_use(self, keys: Iterable[str]) -> set[str]:
        """Those of `keys` that a chunk of any collection uses."""
        keys = list(dict.fromkeys(keys))
        found: set[str] = set()
        for s in range(0, len(keys), 500):  # below SQLite's limit of bound variables
            part = keys[s : s + 500]
            q = f"SELECT DISTINCT cache_key FROM chunks WHERE cache_key IN ({','.join('?' * len(part))})"
            found.update(r[0] for r in self.db.execute(q, part))
        return found

    def sample_chunk(self) -> tuple[str, str, str] | None:
        """(text, cache key, collection) of one chunk, or None for an empty store: enough to check that an
        engine computes the keys this store was built with."""
        return self.db.execute(
            "SELECT c.text, c.cache_key, k.name FROM chunks c JOIN documents d ON d.id = c.document "
            "JOIN collections k ON k.id = d.collection ORDER BY c.id LIMIT 1"
        ).fetchone()

    def texts_of_keys(self, keys: list[str]) -> dict[str, str]:
        """key -> the text of a chunk that uses it (for recomputing missing caches)."""
        q = "SELECT text FROM chunks WHERE cache_key = ? LIMIT 1"
        rows = ((k, self.db.execute(q, (k,)).fetchone()) for k in keys)
        return {k: row[0] for k, row in rows if row}

    def vacuum(self) -> None:
        """Give the space of deleted rows back to the file system (`cache gc`)."""
        self.db.execute("VACUUM")

    def cache_entries(self) -> list[tuple[str, int]]:
        return list(self.db.execute("SELECT key, bytes FROM cache_entries ORDER BY key"))

    def set_cache_bytes(self, key: str, nbytes: int) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE cache_entries SET bytes = ?, created = ? WHERE key = ?", (nbytes, time.time(), key)
            )

    # -- retrieval -------------------------------------------------------------------------------------

    def embeddings(self) -> tuple[list[int], list[bytes]]:
        rows = self.db.execute(
            "SELECT c.id, c.embedding FROM chunks c JOIN documents d ON c.document = d.id "
            "WHERE d.collection = ? ORDER BY c.id",
            (self.cid,),
        ).fetchall()
        return [r[0] for r in rows], [r[1] for r in rows]

    def chunks_by_rowid(self, rowids: list[int]) -> list[ChunkRow]:
        """Rows in the order asked for (missing ids are left out)."""
        q = (
            "SELECT c.id, c.chunk_id, d.doc_id, d.path, c.ordinal, c.text, c.tokens, c.cache_key "
            "FROM chunks c JOIN documents d ON c.document = d.id WHERE c.id = ? AND d.collection = ?"
        )
        out = []
        for r in rowids:
            row = self.db.execute(q, (r, self.cid)).fetchone()
            if row:
                out.append(ChunkRow(*row))
        return out

    def stats(self) -> dict:
        """What the catalog records for this collection. `tokens` are the chunks' text alone, every chunk
        counted (not the prompt form "Passage: ...", which ingest counts). `cache_entries` / `cache_bytes` are
        the caches this collection's chunks name (shared with other collections that hold the same text),
        whether or not their file is still on disk: a file `cache verify` removed keeps its entry until the
        next ingest recomputes it, so `cache stats` compares them with the files present."""
        one = lambda q: self.db.execute(q, {"c": self.cid}).fetchone()[0]  # noqa: E731
        mine = "SELECT c.* FROM chunks c JOIN documents d ON c.document = d.id WHERE d.collection = :c"
        used = f"SELECT key, bytes FROM cache_entries WHERE key IN (SELECT cache_key FROM ({mine}))"
        return {
            "documents": one("SELECT COUNT(*) FROM documents WHERE collection = :c"),
            "files": one("SELECT COUNT(DISTINCT path) FROM documents WHERE collection = :c"),
            "chunks": one(f"SELECT COUNT(*) FROM ({mine})"),
            "tokens": one(f"SELECT COALESCE(SUM(tokens), 0) FROM ({mine})"),
            "cache_entries": one(f"SELECT COUNT(*) FROM ({used})"),
            "cache_bytes": one(f"SELECT COALESCE(SUM(bytes), 0) FROM ({used})"),
        }

    def collection_cache_entries(self) -> list[tuple[str, int]]:
        """(key, bytes) of the cache entries this collection's chunks use."""
        q = (
            "SELECT key, bytes FROM cache_entries WHERE key IN (SELECT c.cache_key FROM chunks c "
            "JOIN documents d ON c.document = d.id WHERE d.collection = ?) ORDER BY key"
        )
        return list(self.db.execute(q, (self.cid,)))
