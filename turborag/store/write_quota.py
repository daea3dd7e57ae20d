"""Per-key write quotas: how many bytes of chunk caches each API key's own passages may add to the store.

A request that sends its own passages (`turborag.contexts`) makes chunk caches the catalog does not record,
so `cache gc` would be the only thing that ever removes them. A key that may write its collection keeps
them (the next request with the same passages starts fast), but only up to its quota: the bytes it has
added are counted in SQLite beside the catalog (`quota.sqlite`), so a restart does not reset them. A charge
is made before the caches are computed, from their exact size in the store's format, so a request beyond
the quota costs no model work. Bytes are counted when charged, not when written: a write that then fails
still counts, which errs on the side of the disk.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

FILE = "quota.sqlite"


class QuotaExceeded(Exception):
    """This key's passages would add more chunk caches than its quota allows; the message names both."""


class WriteQuota:
    """The bytes each key has added, and the limit every key shares."""

    def __init__(self, root: Path, limit: int):
        if limit < 1:
            raise ValueError(f"a write quota must be at least 1 byte, got {limit}")
        self.limit = limit
        self.path = Path(root) / FILE
        self._lock = threading.Lock()
        # the server's worker thread charges, a route may read: one connection, serialised by the lock
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("CREATE TABLE IF NOT EXISTS used (key TEXT PRIMARY KEY, bytes INTEGER NOT NULL)")

    def used(self, key: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT bytes FROM used WHERE key = ?", (key,)).fetchone()
        return row[0] if row else 0

    def charge(self, key: str, nbytes: int) -> None:
        """Count `nbytes` against `key`, or raise QuotaExceeded and count nothing."""
        with self._lock:
            row = self._db.execute("SELECT bytes FROM used WHERE key = ?", (key,)).fetchone()
            used = row[0] if row else 0
            if used + nbytes > self.limit:
                raise QuotaExceeded(
                    f"key {key!r} may add {_mb(self.limit)} of chunk caches with its own passages "
                    f"(--max-cache-bytes-per-key); it has added {_mb(used)} and these need {_mb(nbytes)}: "
                    "ingest the documents into a collection instead, or ask the operator for a larger quota"
                )
            self._db.execute(
                "INSERT INTO used (key, bytes) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET bytes = bytes + excluded.bytes",
                (key, nbytes),
            )

    def budget(self, key: str) -> WriteBudget:
        return WriteBudget(self, key)

    def close(self) -> None:
        self._db.close()


@dataclass(frozen=True)
class WriteBudget:
    """What the engine is handed in place of `persist=True`: store the caches it computes, after charging
    their bytes to this key."""

    quota: WriteQuota
    key: str

    def charge(self, nbytes: int) -> None:
        self.quota.charge(self.key, nbytes)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
