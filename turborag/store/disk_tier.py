"""The bounded disk tier: a file store with a byte cap, least recently used caches evicted on every put.

A cache costs ~18 KB per token for the default model in 16 bits, so an unbounded store grows past any disk.
With a cap (`turborag ingest --max-disk-bytes`, recorded in the store, so every process that opens it uses
the same cap) each put evicts the least recently used caches until the store fits again. A chunk evicted
and asked for later is recomputed by the request (reported as `computed_chunks`) and stored again.

The usage index (bytes and last use of every cache) is an SQLite file next to the caches, `kv/usage.sqlite`,
so it survives restarts; when it is missing or damaged it is rebuilt from the files (last use = mtime), under
the writers' lock (a busy index is waited for, never taken for damaged).
Puts from several processes take an exclusive lock on `kv/.cap.lock` around write + evict, so the cap holds
for the whole store: it is exceeded only while one put is in flight, by at most that one chunk (a single
chunk larger than the cap is kept alone). Reads take no lock; their last-use updates are small SQLite
transactions (WAL mode, so they do not block the writer for long).
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from turborag.store.backends import FileBackend

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (key TEXT PRIMARY KEY, bytes INTEGER NOT NULL, last_used REAL NOT NULL);
CREATE INDEX IF NOT EXISTS usage_lru ON usage (last_used);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


class BoundedFileBackend(FileBackend):
    """`FileBackend` whose total size stays under `max_bytes`, LRU by last use."""

    def __init__(self, root: str | Path, max_bytes: int):
        super().__init__(root)
        if max_bytes < 1:
            raise ValueError(f"--max-disk-bytes must be at least 1 byte, got {max_bytes}")
        self.max_bytes = max_bytes
        kv = self.root / "kv"
        kv.mkdir(parents=True, exist_ok=True)
        self._lock_path = kv / ".cap.lock"
        self._db_path = kv / "usage.sqlite"
        self.db = self._open_index()

    # -- the usage index -----------------------------------------------------------------------------------

    def _open_index(self) -> sqlite3.Connection:
        """Open (or rebuild from the files) the usage index, under the writers' lock.

        Only a damaged index is started over. A busy one (SQLite's OperationalError: another process is
        opening or writing it) is retried and never deleted: a process still writing to an index deleted
        under it keeps a count of its own, and the store then holds up to twice the cap.
        """
        with self._exclusive():
            fresh = not self._db_path.exists()
            try:
                db = self._connect_checked()
            except sqlite3.OperationalError:
                raise
            except sqlite3.DatabaseError:  # damaged: start over from the files
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{self._db_path}{suffix}").unlink(missing_ok=True)
                db, fresh = self._connect(), True
            if fresh:
                self._rebuild(db)
        return db

    def _connect_checked(self, attempts: int = 5) -> sqlite3.Connection:
        """Connect and read the index once; a busy database is retried with a growing pause."""
        attempt = 0
        while True:
            try:
                db = self._connect()
                db.execute("SELECT count(*) FROM usage").fetchone()
                return db
            except sqlite3.OperationalError:
                attempt += 1
                if attempt == attempts:
                    raise
                time.sleep(0.1 * attempt)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._db_path, timeout=30, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(_SCHEMA)
        return db

    def _rebuild(self, db: sqlite3.Connection) -> None:
        """The index from the files on disk: size, and mtime as the last use."""
        rows = []
        for key in super().keys():
            with contextlib.suppress(FileNotFoundError):
                st = self.path(key).stat()
                rows.append((key, st.st_size, st.st_mtime))
        with db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM usage")
            db.executemany("INSERT INTO usage VALUES (?, ?, ?)", rows)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One writer at a time across processes (an flock, released if the process dies)."""
        with open(self._lock_path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _bump(self, name: str, n: int = 1) -> None:
        upsert = "INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + ?"
        self.db.execute(upsert, (name, n, n))

    # -- the backend operations ----------------------------------------------------------------------------

    def get(self, key: str):
        buf = super().get(key)
        if buf is not None:
            self.db.execute("UPDATE usage SET last_used = ? WHERE key = ?", (time.time(), key))
        return buf

    def get_many(self, keys: list[str]) -> dict:
        found = {k: b for k in keys if (b := FileBackend.get(self, k)) is not None}
        if found:
            now = time.time()
            self.db.executemany("UPDATE usage SET last_used = ? WHERE key = ?", [(now, k) for k in found])
        return found

    def put(self, key: str, blob: bytes) -> int:
        with self._exclusive():
            written = super().put(key, blob)
            self.db.execute("INSERT OR REPLACE INTO usage VALUES (?, ?, ?)", (key, written, time.time()))
            self._evict(keep=key)
        return written

    def _evict(self, keep: str) -> None:
        """Delete least recently used caches (never `keep`, the one just written) until within the cap."""
        total = self.db.execute("SELECT coalesce(sum(bytes), 0) FROM usage").fetchone()[0]
        if total <= self.max_bytes:
            return
        victims = self.db.execute(
            "SELECT key, bytes FROM usage WHERE key != ? ORDER BY last_used, key", (keep,)
        ).fetchall()
        for key, nbytes in victims:
            if total <= self.max_bytes:
                break
            self.path(key).unlink(missing_ok=True)
            self.db.execute("DELETE FROM usage WHERE key = ?", (key,))
            self._bump("evictions")
            total -= nbytes

    def delete(self, key: str) -> int:
        freed = super().delete(key)
        self.db.execute("DELETE FROM usage WHERE key = ?", (key,))
        return freed

    def used_bytes(self) -> int:
        return self.db.execute("SELECT coalesce(sum(bytes), 0) FROM usage").fetchone()[0]

    def stats(self) -> dict:
        """Bytes, entries and evictions of this tier (evictions counted since the store was made)."""
        entries, used = self.db.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM usage").fetchone()
        row = self.db.execute("SELECT value FROM counters WHERE name = 'evictions'").fetchone()
        evictions = row[0] if row else 0
        return {"max_bytes": self.max_bytes, "bytes": used, "entries": entries, "evictions": evictions}


def default_cap(root: str | Path) -> int:
    """The cap a server gives a file store that recorded none: the caches it holds now plus half the disk's
    free space. A server whose clients may add caches (uploads, their own passages) must not fill the disk,
    and the store should still be able to double; `--max-disk-bytes` on ingest records another cap, 0 none."""
    import shutil

    kv = Path(root) / "kv"
    held = sum(f.stat().st_size for f in kv.rglob("*") if f.is_file()) if kv.is_dir() else 0
    return held + shutil.disk_usage(root).free // 2


def cap_note(backend) -> str:
    """One line on how much disk the store's caches may take, for a server's start."""
    if isinstance(backend, BoundedFileBackend):
        return (
            f"caches capped at {backend.max_bytes / 1e9:.1f} GB on disk ({backend.used_bytes() / 1e9:.1f} GB "
            "held; least recently used evicted beyond it)"
        )
    if isinstance(backend, FileBackend):
        return "caches on disk without a cap (recorded as 0 by `turborag ingest --max-disk-bytes 0`)"
    return f"caches in {type(backend).__name__} (its own memory limit caps them)"
