"""Store URLs: which backend a `--store-url` (or a store folder) names, opened.

Kept apart from backends.py because it knows every backend (the files, the bounded disk tier built on them,
Redis), while each backend module knows only its own kind.
"""

from __future__ import annotations

from pathlib import Path

from turborag.store.backends import Backend, FileBackend


def open_backend(url: str | Path, max_disk_bytes: int | None = None) -> Backend:
    """The backend a store URL names: a path or `file:///path` (files; capped at `max_disk_bytes` by
    disk_tier.py when given), `redis://host:port/db` or `redis+cluster://host:port` (store/redis_backend.py;
    needs the `redis` package; its size is Redis's own `maxmemory`)."""
    text = str(url)
    if text.startswith(("redis://", "rediss://", "redis+cluster://")):
        if max_disk_bytes:
            raise ValueError(
                "--max-disk-bytes caps a file store; a Redis store is capped by Redis itself "
                "(maxmemory with maxmemory-policy allkeys-lru)"
            )
        from turborag.store.redis_backend import open_redis

        return open_redis(text)
    if max_disk_bytes:
        from turborag.store.disk_tier import BoundedFileBackend

        return BoundedFileBackend(_file_path(text), max_disk_bytes)
    return FileBackend(_file_path(text))


def _file_path(text: str) -> str:
    """The local path of a file store URL (or plain path)."""
    if text.startswith("file://"):
        from urllib.parse import unquote, urlparse

        parsed = urlparse(text)
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{text}: a file:// store URL names a local path (file:///path)")
        return unquote(parsed.path)
    if "://" in text:
        raise ValueError(
            f"unknown store URL {text!r}: use file:///path, redis://host:port/db or redis+cluster://host:port"
        )
    return text
