"""Where cache blobs live: a backend maps a content-addressed key to the bytes of one blob (codec.py).

A backend knows nothing about tensors; it stores, returns and deletes blobs, and lists its keys. `KVStore`
(kv_store.py) puts the codec and the tiers in front of one. This module has the local one:

`FileBackend`: `root/kv/ab/<key>.safetensors`. Writes go to a temp file that is fsynced and renamed into place
(atomic on POSIX), so a crash leaves either the old state or the new file, never half a file. `get` returns a
`FileBlob`: the open file, from which the codec reads the header and then only the tensors a request needs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol


class Backend(Protocol):
    """The operations a cache backend offers. Keys are 64 hex digits (sha256)."""

    url: str

    def get(self, key: str): ...  # the blob (a writable buffer, or a codec.Blob), or None when missing

    def get_many(self, keys: list[str]) -> dict: ...  # key -> blob for the keys present

    def put(self, key: str, blob: bytes) -> int: ...  # bytes written

    def delete(self, key: str) -> int: ...  # bytes freed (0 if it was missing)

    def size(self, key: str) -> int | None: ...  # bytes, or None when missing

    def keys(self) -> Iterator[str]: ...

    def __contains__(self, key: str) -> bool: ...


class FileBlob:
    """One blob file, open, read in ranges (codec.Blob): each `read_range` is one pread into a new buffer, so
    only the header and the tensors a request needs are read, and the tensors own their memory.

    Not a private mapping of the file (zero-copy views): at 8k context tokens a copy measured as fast as a
    mapping with caches cold and faster warm (turborag_research/notes/2026-12-06-ttft-floor.md). The
    tensors also own their memory:
    the RAM tier never holds a mapping that keeps a deleted file's blocks (the bounded disk tier's
    evictions) on disk, and the file is closed once it is decoded.
    """

    def __init__(self, file):
        self.file = file  # an unbuffered binary file, closed with this object
        self.size = os.fstat(file.fileno()).st_size

    def __len__(self) -> int:
        return self.size

    def read_range(self, start: int, end: int) -> bytearray:
        """Bytes [start, end), or fewer if the file ends before `end` (the codec calls that damage)."""
        buf = bytearray(max(0, end - start))
        got = os.preadv(self.file.fileno(), [buf], start) if buf else 0
        return buf if got == len(buf) else buf[:got]

    def read_into(self, start: int, bufs: list) -> int:
        """The bytes from `start` on into `bufs`, in order, with one preadv; returns how many were read."""
        return os.preadv(self.file.fileno(), bufs, start) if bufs else 0


class FileBackend:
    """One file per blob under `root/kv/`, sharded by the key's first two hex digits."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.url = self.root.resolve().as_uri()

    def path(self, key: str) -> Path:
        return self.root / "kv" / key[:2] / f"{key}.safetensors"

    def __contains__(self, key: str) -> bool:
        return self.path(key).exists()

    def get(self, key: str) -> FileBlob | None:
        try:
            # The open file, not its path: a blob replaced meanwhile (os.replace) is still read whole.
            return FileBlob(open(self.path(key), "rb", buffering=0))
        except FileNotFoundError:
            return None

    def get_many(self, keys: list[str]) -> dict:
        found = {k: self.get(k) for k in keys}
        return {k: b for k, b in found.items() if b is not None}

    def put(self, key: str, blob: bytes) -> int:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".safetensors")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return len(blob)

    def delete(self, key: str) -> int:
        size = self.size(key) or 0
        self.path(key).unlink(missing_ok=True)
        return size

    def size(self, key: str) -> int | None:
        try:
            return self.path(key).stat().st_size
        except FileNotFoundError:
            return None

    def keys(self) -> Iterator[str]:
        for f in self._files():
            if f.parent.name == f.stem[:2]:
                yield f.stem

    def stray_files(self) -> list[Path]:
        """Files that are no blob of this store: temp files left by killed writers, files in the wrong shard
        folder (`cache gc` removes them while no ingest runs)."""
        kv = self.root / "kv"
        temp = sorted(kv.glob("*/.tmp-*")) if kv.is_dir() else []
        return temp + [f for f in self._files() if f.parent.name != f.stem[:2]]

    def _files(self) -> list[Path]:
        kv = self.root / "kv"
        if not kv.is_dir():
            return []
        return [f for f in sorted(kv.glob("*/*.safetensors")) if not f.name.startswith(".")]
