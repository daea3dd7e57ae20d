"""Content-addressed store of chunk K/V caches: safetensors files on disk, never pickle.

Key = sha256(key version, model fingerprint, store dtype, prefix token ids, chunk token ids). Any change to
the model, the instruction prefix or the chunk text gives a new key, so a stale cache can never be served;
old files are garbage once nothing references them. `KEY_VERSION` versions what a key *means*; it is not
the file format, so rewriting files in a new format (`cache verify --migrate`) keeps every key.

File format 2 (what `put` writes): one tensor per layer and kind, `k.{i}` and `v.{i}`, each (kv_heads, T,
head_dim) in the store dtype, and in the safetensors metadata `format: turborag-kv`, `version: "2"`,
`layers`, `tokens` and one xxh3-64 hash per tensor (`xxh3.k.{i}`, hex).

- Per-layer tensors: a request reads only the layers it needs. With Gemma 3 most chunks of a long context
  only matter to the global-attention layers (a sliding-window layer sees the last 511 positions), so a
  request typically needs 3 of 18 layers; with one stacked tensor it would read all 18.
- A hash per tensor: verification covers exactly what is read, at memory speed (xxh3 runs at tens of
  GB/s, CRC32 in zlib at ~1), so checking never costs more than the read it guards. A damaged tensor that
  is never requested is never used either; it is caught (and the file removed) when it is requested, by
  `get`, or by `cache verify`.
- mmap (`get_layers`): tensors are zero-copy views over a private copy-on-write mapping, so pages of layers
  not requested are never read from disk, and a requested layer costs one pass (the hash) plus whatever
  the caller does with it (usually one copy to the device). The mapping lives as long as a returned view.

File format 1 (written by earlier versions, still read): tensors `k` and `v`, (layers, kv_heads, T,
head_dim), and a CRC32 of the whole data section; reading it checks the whole file, whatever is asked for.
`cache verify --migrate` rewrites such files as format 2 under the same keys.

Writes go to a temp file that is fsynced and renamed into place (atomic on POSIX), so a crash leaves either
the old state or the new file, never half a file. Reads verify what they return: a damaged file is logged,
deleted and reported as missing (the caller recomputes it), never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import mmap
import os
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash
from safetensors.torch import save as st_save

from turborag.store.chunk_kv import ChunkKV

log = logging.getLogger(__name__)

KEY_VERSION = "1"  # what a key means (goes into cache_key and the catalog); not the file format
FILE_FORMAT = "2"  # what put writes; get and get_layers also read format "1"
_MAGIC = "turborag-kv"
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_ST_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}
_MAX_HEADER = 100_000_000  # safetensors' own limit: a larger length is damage, not a header to read

Layers = list[tuple[torch.Tensor, torch.Tensor] | None]


def cache_key(fingerprint: str, prefix_ids: list[int], chunk_ids: list[int], dtype: str = "float16") -> str:
    h = hashlib.sha256()
    h.update(json.dumps([KEY_VERSION, fingerprint, dtype, prefix_ids, chunk_ids]).encode())
    return h.hexdigest()


class _Damaged(Exception):
    """A cache file that must not be used; the message says what is wrong with it."""


def _xxh3(buf) -> str:
    return xxhash.xxh3_64_hexdigest(buf)


def _header_length(first8: bytes, size: int) -> int:
    """Length of the JSON header from the first 8 bytes of a file of `size` bytes."""
    if len(first8) < 8:
        raise _Damaged("truncated")
    n = int.from_bytes(first8, "little")
    if n > min(size - 8, _MAX_HEADER):
        raise _Damaged("header length beyond the file")
    return n


def _decode_header(raw: bytes) -> tuple[dict, dict]:
    """(tensor entries, metadata) of a turborag cache header."""
    try:
        header = json.loads(raw)
    except ValueError as e:  # includes UnicodeDecodeError
        raise _Damaged("unreadable header") from e
    if not isinstance(header, dict):
        raise _Damaged("unreadable header")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or meta.get("format") != _MAGIC:
        raise _Damaged("not a turborag cache")
    return header, meta


@dataclass(frozen=True)
class _Entry:
    """One tensor of the data section, checked against the data section's size."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # byte offsets relative to the start of the data section
    end: int

    def tensor(self, data: memoryview) -> torch.Tensor:
        """Zero-copy view of the tensor over `data` (a writable buffer)."""
        numel = math.prod(self.shape)
        if numel == 0:  # frombuffer refuses an empty count
            return torch.empty(self.shape, dtype=self.dtype)
        return torch.frombuffer(data, dtype=self.dtype, count=numel, offset=self.start).view(self.shape)


class KVStore:
    """Chunk caches under `root/kv/ab/<key>.safetensors`."""

    def __init__(self, root: str | Path, dtype: str = "float16"):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown store dtype {dtype!r}: use one of {sorted(_DTYPES)}")
        self.root = Path(root)
        self.dtype = dtype
        self.torch_dtype = _DTYPES[dtype]
        self.hits = 0
        self.misses = 0

    def path(self, key: str) -> Path:
        return self.root / "kv" / key[:2] / f"{key}.safetensors"

    def __contains__(self, key: str) -> bool:
        return self.path(key).exists()

    # -- writing -------------------------------------------------------------------------------------------

    def put(self, key: str, kv: ChunkKV) -> int:
        """Write atomically in format 2; returns bytes written."""
        k = kv.k.detach().to("cpu", self.torch_dtype)  # (L, H, T, D)
        v = kv.v.detach().to("cpu", self.torch_dtype)  # (L, H, T, D)
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(f"K and V must be (layers, kv_heads, T, head_dim), got {k.shape}, {v.shape}")
        layers, _, tokens, _ = k.shape
        tensors: dict[str, torch.Tensor] = {}
        meta = {"format": _MAGIC, "version": FILE_FORMAT, "layers": str(layers), "tokens": str(tokens)}
        for i in range(layers):
            for kind, stacked in (("k", k), ("v", v)):
                # A copy per layer: some safetensors versions refuse tensors that share a storage, and the
                # write path is not the hot one.
                t = stacked[i].clone(memory_format=torch.contiguous_format)  # (H, T, D)
                tensors[f"{kind}.{i}"] = t
                meta[f"xxh3.{kind}.{i}"] = _xxh3(t.view(torch.uint8).numpy())  # the bytes as stored
        blob = st_save(tensors, metadata=meta)
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

    # -- reading -------------------------------------------------------------------------------------------

    def get(self, key: str) -> ChunkKV | None:
        """The stored cache, stacked (L, H, T, D) and verified in full, or None if missing or damaged (a
        damaged file is logged and deleted). A copy, not tied to the file: for the hot path, where only some
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

        The tensors are zero-copy views over a private mapping of the file (writable; writes never reach
        the file), each checked against its hash before it is returned. Returns None if the file is missing
        or damaged (a damaged file is logged and deleted, like `get`). A format-1 file is checked whole
        (CRC32 of its data section) and returned as views of its stacked tensors. An index outside the
        cache's layers is the caller's error: IndexError, and the file is kept."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                # ACCESS_COPY: private and writable, so torch.frombuffer takes it without a warning, and
                # nothing is read from disk until a page is touched. The mapping outlives the file object.
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size >= 8 else None
        except FileNotFoundError:
            self.misses += 1
            return None
        try:
            if mm is None:
                raise _Damaged("truncated")
            out = self._read_layers(mm, layers)
        except _Damaged as e:
            log.warning("damaged cache file %s (%s): ignored and removed; it will be recomputed", path, e)
            path.unlink(missing_ok=True)
            self.misses += 1
            return None
        self.hits += 1
        return out

    def file_format(self, key: str) -> str | None:
        """The file format, "1" or "2", read from the header only; None if missing or unreadable."""
        try:
            with open(self.path(key), "rb") as f:
                n = _header_length(f.read(8), os.fstat(f.fileno()).st_size)
                _, meta = _decode_header(f.read(n))
        except (OSError, _Damaged):
            return None
        version = meta.get("version")
        return version if version in ("1", "2") else None

    def _read_layers(self, mm: mmap.mmap, layers: list[int] | None) -> Layers:
        n = _header_length(mm[:8], len(mm))
        header, meta = _decode_header(mm[8 : 8 + n])
        data = memoryview(mm)[8 + n :]  # the data section: offsets in the header are relative to it
        version = meta.get("version")
        if version == "2":
            return self._layers_v2(header, meta, data, 8 + n, layers)
        if version == "1":
            return self._layers_v1(header, meta, data, 8 + n, layers)
        raise _Damaged(f"unknown format version {version!r}")

    def _layers_v2(self, header: dict, meta: dict, data: memoryview, base: int, layers) -> Layers:
        try:
            n_layers, tokens = int(meta["layers"]), int(meta["tokens"])
        except (KeyError, TypeError, ValueError) as e:
            raise _Damaged("layer or token count missing") from e
        names = {f"{kind}.{i}" for i in range(n_layers) for kind in "kv"}
        if n_layers < 1 or set(header) != names:
            raise _Damaged("unexpected tensors")
        try:  # a truncated (or extended) file, whichever layer it hits: safetensors data has no gaps
            complete = max(e["data_offsets"][1] for e in header.values()) == len(data)
        except (TypeError, KeyError, IndexError) as e:
            raise _Damaged("bad offsets") from e
        if not complete:
            raise _Damaged("data section size differs from the header")
        out: Layers = [None] * n_layers
        shapes = set()
        for i in self._wanted(layers, n_layers):
            # Like the hashes, only the entries of requested tensors are checked: the others are not used,
            # and checking all of them would be most of the cost of a small request.
            pair = []
            for kind in "kv":
                e = self._entry(f"{kind}.{i}", header[f"{kind}.{i}"], 3, data, base)
                shapes.add(e.shape)
                if len(shapes) > 1 or e.shape[1] != tokens:
                    raise _Damaged("tensor shapes differ")
                if _xxh3(data[e.start : e.end]) != meta.get(f"xxh3.{e.name}"):
                    raise _Damaged(f"hash mismatch in {e.name}")
                pair.append(e.tensor(data))  # (H, T, D)
            out[i] = (pair[0], pair[1])
        return out

    def _layers_v1(self, header: dict, meta: dict, data: memoryview, base: int, layers) -> Layers:
        if str(zlib.crc32(data)) != meta.get("crc32"):  # the whole data section: format 1 has one checksum
            raise _Damaged("checksum mismatch")
        if set(header) != {"k", "v"}:
            raise _Damaged("unexpected tensors")
        ek, ev = (self._entry(name, header[name], 4, data, base) for name in ("k", "v"))
        if ek.shape != ev.shape or ek.shape[0] < 1:
            raise _Damaged("tensor shapes differ")
        k, v = ek.tensor(data), ev.tensor(data)  # (L, H, T, D)
        wanted = set(self._wanted(layers, ek.shape[0]))
        return [(k[i], v[i]) if i in wanted else None for i in range(ek.shape[0])]

    @staticmethod
    def _wanted(layers: list[int] | None, n_layers: int) -> list[int]:
        if layers is None:
            return list(range(n_layers))
        bad = [i for i in layers if not 0 <= i < n_layers]
        if bad:
            raise IndexError(f"layers {bad} requested from a cache of {n_layers} layers")
        return sorted(set(layers))

    def _entry(self, name: str, entry, ndim: int, data: memoryview, base: int) -> _Entry:
        """The header entry of one tensor, checked: store dtype, shape, offsets inside the data section and
        consistent with the shape, aligned for its dtype."""
        if not isinstance(entry, dict):
            raise _Damaged(f"bad entry for {name}")
        dtype = _ST_DTYPES.get(entry.get("dtype"))
        if dtype != self.torch_dtype:
            raise _Damaged(f"{name} is {entry.get('dtype')}, the store holds {self.dtype}")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not (
            isinstance(shape, list) and len(shape) == ndim and all(type(d) is int and d >= 0 for d in shape)
        ):
            raise _Damaged(f"bad shape for {name}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise _Damaged(f"bad offsets for {name}")
        start, end = offsets
        itemsize = dtype.itemsize
        if not 0 <= start <= end <= len(data) or end - start != math.prod(shape) * itemsize:
            raise _Damaged(f"offsets of {name} out of range")
        if (base + start) % itemsize:  # safetensors aligns every tensor; torch needs it
            raise _Damaged(f"{name} misaligned")
        return _Entry(name, dtype, tuple(shape), start, end)
