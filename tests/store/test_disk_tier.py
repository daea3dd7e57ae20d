"""The bounded disk tier: the cap always holds (also with concurrent writers), LRU by last use, a persistent
usage index rebuilt from the files when lost, and a capped store that still answers right."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3

import pytest

from turborag.store.disk_tier import BoundedFileBackend, cap_note, default_cap


def _key(i: int) -> str:
    return f"{i:064x}"


def _on_disk(root) -> int:
    return sum(f.stat().st_size for f in (root / "kv").glob("*/*.safetensors"))


def test_the_cap_holds_and_the_least_recently_used_go_first(tmp_path):
    disk = BoundedFileBackend(tmp_path, max_bytes=5000)
    for i in range(4):
        disk.put(_key(i), bytes(1000))
    assert disk.get(_key(0)) is not None  # 0 is now the most recently used
    for i in range(4, 12):
        disk.put(_key(i), bytes(1000))
        assert disk.used_bytes() <= 5000 and _on_disk(tmp_path) <= 5000
    assert _key(0) not in disk  # eventually old enough to go too
    assert _key(11) in disk and _key(7) in disk and _key(1) not in disk
    assert disk.stats()["evictions"] == 7 and disk.stats()["entries"] == 5


def test_recently_read_survives(tmp_path):
    disk = BoundedFileBackend(tmp_path, max_bytes=3000)
    for i in range(3):
        disk.put(_key(i), bytes(1000))
    disk.get_many([_key(0)])
    disk.put(_key(3), bytes(1000))
    assert _key(0) in disk and _key(1) not in disk


def test_one_blob_larger_than_the_cap_is_kept_alone(tmp_path):
    disk = BoundedFileBackend(tmp_path, max_bytes=1500)
    disk.put(_key(0), bytes(1000))
    disk.put(_key(1), bytes(4000))
    assert _key(1) in disk and _key(0) not in disk and disk.used_bytes() == 4000


def test_the_index_survives_restarts_and_is_rebuilt_when_lost_or_damaged(tmp_path):
    disk = BoundedFileBackend(tmp_path, max_bytes=3000)
    for i in range(5):
        disk.put(_key(i), bytes(1000))
    again = BoundedFileBackend(tmp_path, max_bytes=3000)
    assert again.stats() == disk.stats() and again.stats()["evictions"] == 2
    for name in ("usage.sqlite", "usage.sqlite-wal", "usage.sqlite-shm"):
        (tmp_path / "kv" / name).unlink(missing_ok=True)
    rebuilt = BoundedFileBackend(tmp_path, max_bytes=3000)
    assert rebuilt.stats()["entries"] == 3 and rebuilt.used_bytes() == 3000
    (tmp_path / "kv" / "usage.sqlite").write_bytes(b"not a database at all" * 100)
    damaged = BoundedFileBackend(tmp_path, max_bytes=3000)
    assert damaged.stats()["entries"] == 3
    damaged.put(_key(9), bytes(1000))
    assert _on_disk(tmp_path) <= 3000


def _writer(root, start: int) -> None:
    disk = BoundedFileBackend(root, max_bytes=8000)
    for i in range(start, start + 40):
        disk.put(_key(i), bytes(700))


def test_concurrent_writers_keep_to_one_cap(tmp_path):
    BoundedFileBackend(tmp_path, max_bytes=8000)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(tmp_path, s)) for s in (0, 1000)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    disk = BoundedFileBackend(tmp_path, max_bytes=8000)
    assert _on_disk(tmp_path) <= 8000 and disk.used_bytes() == _on_disk(tmp_path)
    assert disk.stats()["entries"] == len(list(disk.keys()))


def test_a_busy_index_is_waited_for_not_taken_for_damaged(tmp_path, monkeypatch):
    """SQLite says "database is locked" while another process opens or writes the index: that index is
    live, and deleting it would leave that process counting alone (the store then holds twice the cap)."""
    disk = BoundedFileBackend(tmp_path, max_bytes=3000)
    for i in range(3):
        disk.put(_key(i), bytes(1000))
    disk.get(_key(0))  # last use differs from the files' mtime: a rebuild would lose it
    used = dict(disk.db.execute("SELECT key, last_used FROM usage").fetchall())
    real_connect, calls = BoundedFileBackend._connect, []

    def busy_twice(self):
        calls.append(1)
        if len(calls) <= 2:
            raise sqlite3.OperationalError("database is locked")
        return real_connect(self)

    monkeypatch.setattr(BoundedFileBackend, "_connect", busy_twice)
    again = BoundedFileBackend(tmp_path, max_bytes=3000)
    assert len(calls) == 3
    assert dict(again.db.execute("SELECT key, last_used FROM usage").fetchall()) == used

    def always_busy(self):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(BoundedFileBackend, "_connect", always_busy)
    with pytest.raises(sqlite3.OperationalError):
        BoundedFileBackend(tmp_path, max_bytes=3000)
    assert (tmp_path / "kv" / "usage.sqlite").exists()
    assert dict(disk.db.execute("SELECT key, last_used FROM usage").fetchall()) == used


def test_the_default_cap_is_the_caches_held_plus_half_the_free_space(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    (tmp_path / "kv" / "ab").mkdir(parents=True)
    (tmp_path / "kv" / "ab" / "one").write_bytes(b"x" * 300)
    (tmp_path / "kv" / "two").write_bytes(b"y" * 200)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage(10_000, 4_000, 6_000))
    assert default_cap(tmp_path) == 500 + 3_000
    assert default_cap(tmp_path / "missing-is-empty") == 3_000


def test_the_cap_note_names_the_cap_or_its_absence(tmp_path):
    from turborag.store.backends import FileBackend

    bounded = BoundedFileBackend(tmp_path / "a", 2_500_000_000)
    assert "capped at 2.5 GB" in cap_note(bounded)
    assert "without a cap" in cap_note(FileBackend(tmp_path / "b"))
