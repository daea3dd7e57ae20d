"""Content-addressed store of chunk K/V caches: blobs (codec.py) in a backend (backends.py).

Key = sha256(key version, model fingerprint, cache format, prefix token ids, chunk token ids). Any change to
the model, the instruction prefix or the chunk text gives a new key, so a stale cache can never be served;
old blobs are garbage once nothing references them. `KEY_VERSION` versions what a key *means*; it is not
the blob format, so rewriting blobs in a new format (`cache verify --migrate`) keeps every key, and keys are
the same whichever backend holds the blobs.

Reads verify what they return: a damaged blob is logged, deleted and reported as missing (the caller
recomputes it), never used.

The cache format (`cache_format`) is one of `codec.FORMATS`: float16, bfloat16, float32 (the tensors
cast), or int8 and fp8 (quantized, about half the bytes of float16, read back dequantized to float16;
codec.py says how). It is part of the key, so stores of different formats never share a cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch

from turborag.store import codec
from turborag.store.backends import Backend, FileBackend
from turborag.store.chunk_kv import ChunkKV
from turborag.store.codec import FILE_FORMAT, Layers
from turborag.store.errors import StoreUnavailable

log = logging.getLogger(__name__)

KEY_VERSION = "1"  # what a key means (goes into cache_key and the catalog); not the blob format
__all__ = ["FILE_FORMAT", "KEY_VERSION", "KVStore", "Layers", "StoredChunk", "cache_key"]


def cache_key(
    fingerprint: str,
    prefix_ids: list[int],
    chunk_ids: list[int],
    cache_format: str = "float16",
    scope: str = "",
) -> str:
    """The store key of a chunk's cache. `scope` (a collection's name, in a store that isolates
    collections) keys the same text apart per scope; empty, the key is the one every store has used."""
    h = hashlib.sha256()
    fields = [KEY_VERSION, fingerprint, cache_format, prefix_ids, chunk_ids]
    h.update(json.dumps([*fields, scope] if scope else fields).encode())
    return h.hexdigest()


class KVStore:
    """Chunk caches in one backend; `KVStore(root)` keeps them as files, `root/kv/ab/<key>.safetensors`.

    `cache_format` is a name from `codec.FORMATS`; `torch_dtype` is the dtype that reads return
    (for int8 and fp8, float16: the dequantized values)."""

    def __init__(self, root: str | Path | Backend, cache_format: str = "float16"):
        if cache_format not in codec.FORMATS:
            raise ValueError(f"unknown cache format {cache_format!r}: use one of {', '.join(codec.FORMATS)}")
        self.backend = FileBackend(root) if isinstance(root, (str, Path)) else root
        self.cache_format = cache_format
        self.torch_dtype = codec.decoded_dtype(cache_format)
        self.quantized = cache_format in codec.QUANT
        self.hits = 0
        self.misses = 0
        self.unavailable = 0  # reads that found the backend unreachable

    @property
    def root(self) -> Path:
        """The folder of a file store (other backends have none)."""
        return self.backend.root

    def path(self, key: str) -> Path:
        """The file of a key in a file store."""
        return self.backend.path(key)

    def __contains__(self, key: str) -> bool:
        return key in self.backend

    def size(self, key: str) -> int | None:
        """Bytes stored for `key`, or None when missing."""
        return self.backend.size(key)

    def delete(self, key: str) -> int:
        """Remove a cache; returns the bytes freed."""
        return self.backend.delete(key)

    def keys(self):
        return self.backend.keys()

    # -- writing -------------------------------------------------------------------------------------------

    def put(self, key: str, kv: ChunkKV) -> int:
        """Store atomically in format 2; returns bytes written."""
        return self.backend.put(key, codec.encode(kv, self.cache_format))

    def as_stored(self, kv: ChunkKV) -> ChunkKV:
        """What `put` followed by `get` returns (cast, or quantized and dequantized), on kv's device: a chunk
        computed during a request is then numerically the one every later request reads."""
        return codec.as_stored(kv, self.cache_format)

    # -- reading -------------------------------------------------------------------------------------------

    def get(self, key: str) -> ChunkKV | None:
        """The stored cache, stacked (L, H, T, D) and verified in full, or None if missing or damaged (a
        damaged blob is logged and deleted). A copy, not tied to the blob: for the hot path, where only some
        layers are needed, use `get_layers`."""
        layers = self.get_layers(key)
        if layers is None:
            return None
        return ChunkKV(
            torch.stack([k for k, _ in layers]),  # (L, H, T, D)
            torch.stack([v for _, v in layers]),  # (L, H, T, D)
        )

    def get_layers(self, key: str, layers: list[int] | None = None) -> Layers | None:
        """Per-layer (k, v), each (kv_heads, T, head_dim), for the layer indices asked for (all if None);
        the other entries of the list are None and their bytes are neither read nor checked.

        The tensors are views over the bytes read for them (for a file, a copy of just those bytes; for a
        blob in memory, that memory), each checked against its hash before it is returned; in a quantized
        store they are new tensors, dequantized from checked bytes. Returns None if the blob is missing or
        damaged (a damaged blob is logged and deleted, like `get`). A format-1 blob is checked whole. An index
        outside the cache's layers is the caller's error: IndexError, blob kept."""
        return self._decode(key, self.backend.get(key), layers)

    def get_many_layers(self, wanted: dict[str, list[int] | None]) -> dict[str, Layers | None]:
        """`get_layers` for many keys at once: one round trip to a remote backend (pipelined). A backend
        that cannot be reached is a miss for every key (logged): the caller recomputes, nobody hangs."""
        found = self._get_many(list(wanted))
        return {key: self._decode(key, found.get(key), layers) for key, layers in wanted.items()}

    def open_many(self, wanted: dict[str, list[int] | None]) -> dict[str, StoredChunk | Layers | None]:
        """Like `get_many_layers`, but a blob's tensors are not read yet: each chunk comes back open
        (`StoredChunk`), for serving assembly to read the tensors it needs straight into the buffers that
        serve them (kv.assemble_into). Only for a cast format, read on the CPU in that very dtype. A format-1
        blob, which has one checksum for the whole, is decoded now, as `get_layers` does."""
        if self.quantized:
            raise ValueError(f"a {self.cache_format} store dequantizes its caches: use get_many_layers")
        found = self._get_many(list(wanted))
        out: dict[str, StoredChunk | Layers | None] = {}
        for key, layers in wanted.items():
            buf = found.get(key)
            try:
                reader = None if buf is None else codec.open_reader(buf, self.cache_format)
            except codec.Damaged as e:
                self._damaged(key, e)
                out[key] = None
                continue
            if reader is None:
                out[key] = self._decode(key, buf, layers)  # missing, or format 1
            else:
                self.hits += 1
                out[key] = StoredChunk(self, key, reader)
        return out

    def _get_many(self, keys: list[str]) -> dict:
        """The blobs of `keys` that the backend has, in one round trip; none if it cannot be reached."""
        try:
            return self.backend.get_many(keys)
        except StoreUnavailable as e:
            log.warning("%s; computing the %d chunk caches of this request instead", e, len(keys))
            self.unavailable += 1
            return {}

    def _decode(self, key: str, buf, layers: list[int] | None) -> Layers | None:
        if buf is None:
            self.misses += 1
            return None
        try:
            out = codec.decode(buf, self.cache_format, layers)
        except codec.Damaged as e:
            self._damaged(key, e)
            return None
        self.hits += 1
        return out

    def _damaged(self, key: str, e: codec.Damaged) -> None:
        url = self.backend.url
        log.warning("damaged cache %s in %s (%s): ignored and removed; it will be recomputed", key, url, e)
        self.backend.delete(key)
        self.misses += 1

    def file_format(self, key: str) -> str | None:
        """The blob format, "1" or "2", read from the header only; None if missing or unreadable."""
        buf = self.backend.get(key)
        return None if buf is None else codec.blob_format(buf)


class StoredChunk:
    """One chunk's blob, open, its tensors not read yet (`KVStore.open_many`): serving assembly reads each
    one it needs into its place in the serving buffers (codec.TensorReader.read_into). A tensor that fails its
    check is logged and its blob deleted, as on any read, and codec.Damaged goes on to the caller, which must
    discard what it assembled and read the request again: the chunk is then missing, and computed."""

    def __init__(self, store: KVStore, key: str, reader: codec.TensorReader):
        self.store = store
        self.key = key
        self.reader = reader
        self.tokens = reader.tokens

    def read_into(self, layer: int, kind: str, out: torch.Tensor) -> None:
        """Tensor `kind` ("k" or "v") of `layer`, (H, T, D), checked, into `out` (codec.TensorReader)."""
        try:
            self.reader.read_into(layer, kind, out)
        except codec.Damaged as e:
            self.store.hits -= 1  # counted when it was opened
            self.store._damaged(self.key, e)
            raise
