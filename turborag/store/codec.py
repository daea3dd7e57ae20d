"""The bytes of one chunk cache: a self-describing, hash-checked safetensors blob, never pickle.

Any backend stores these blobs as they are (a file, a Redis value), so what a blob means and how it is checked
lives here, once.

Format 2 (what `encode` writes): one tensor per layer and kind, `k.{i}` and `v.{i}`, each (kv_heads, T,
head_dim) in the store dtype, and in the safetensors metadata `format: turborag-kv`, `version: "2"`,
`layers`, `tokens` and one xxh3-64 hash per tensor (`xxh3.k.{i}`, hex).

- Per-layer tensors: a request reads only the layers it needs. With Gemma 3 most chunks of a long context
  only matter to the global-attention layers (a sliding-window layer sees the last 511 positions), so a
  request typically needs 3 of 18 layers; with one stacked tensor it would read all 18.
- A hash per tensor: verification covers exactly what is read, at memory speed (xxh3 runs at tens of
  GB/s, CRC32 in zlib at ~1), so checking never costs more than the read it guards. A damaged tensor that
  is never requested is never used either; it is caught when it is requested, or by `cache verify`.
- Decoding returns zero-copy views over the buffer it is given (a private file mapping, or the bytes read
  from Redis), so a requested layer costs one pass (the hash) plus whatever the caller does with it.

Format 1 (written by early versions, still read): tensors `k` and `v`, (layers, kv_heads, T, head_dim), and a
CRC32 of the whole data section; reading it checks the whole blob, whatever is asked for.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass

import torch
import xxhash
from safetensors.torch import save as st_save

from turborag.store.chunk_kv import ChunkKV

FILE_FORMAT = "2"  # what encode writes; decode also reads format "1"
MAGIC = "turborag-kv"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_ST_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}
_MAX_HEADER = 100_000_000  # safetensors' own limit: a larger length is damage, not a header to read

Layers = list[tuple[torch.Tensor, torch.Tensor] | None]


class Damaged(Exception):
    """A blob that must not be used; the message says what is wrong with it."""


def xxh3(buf) -> str:
    return xxhash.xxh3_64_hexdigest(buf)


def encode(kv: ChunkKV, dtype: torch.dtype) -> bytes:
    """Format 2 bytes of `kv`, its tensors in `dtype`."""
    k = kv.k.detach().to("cpu", dtype)  # (L, H, T, D)
    v = kv.v.detach().to("cpu", dtype)  # (L, H, T, D)
    if k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"K and V must be (layers, kv_heads, T, head_dim), got {k.shape}, {v.shape}")
    layers, _, tokens, _ = k.shape
    tensors: dict[str, torch.Tensor] = {}
    meta = {"format": MAGIC, "version": FILE_FORMAT, "layers": str(layers), "tokens": str(tokens)}
    for i in range(layers):
        for kind, stacked in (("k", k), ("v", v)):
            # A copy per layer: some safetensors versions refuse tensors that share a storage, and the
            # write path is not the hot one.
            t = stacked[i].clone(memory_format=torch.contiguous_format)  # (H, T, D)
            tensors[f"{kind}.{i}"] = t
            meta[f"xxh3.{kind}.{i}"] = xxh3(t.view(torch.uint8).numpy())  # the bytes as stored
    return st_save(tensors, metadata=meta)


def blob_format(buf) -> str | None:
    """The format, "1" or "2", read from the header only; None if unreadable."""
    try:
        n = header_length(bytes(buf[:8]), len(buf))
        _, meta = decode_header(bytes(buf[8 : 8 + n]))
    except Damaged:
        return None
    version = meta.get("version")
    return version if version in ("1", "2") else None


def decode(buf, dtype: torch.dtype, layers: list[int] | None = None) -> Layers:
    """Per-layer (k, v), each (kv_heads, T, head_dim), for the layer indices asked for (all if None), as
    views over `buf` (a writable buffer that must outlive them); other entries are None, their bytes neither
    read nor checked. Raises Damaged for anything that is not a sound blob of `dtype`, and IndexError for a
    layer outside the cache (the caller's error, not damage)."""
    if len(buf) < 8:
        raise Damaged("truncated")
    n = header_length(bytes(buf[:8]), len(buf))
    header, meta = decode_header(bytes(buf[8 : 8 + n]))
    data = memoryview(buf)[8 + n :]  # the data section: offsets in the header are relative to it
    version = meta.get("version")
    if version == "2":
        return _layers_v2(header, meta, data, 8 + n, dtype, layers)
    if version == "1":
        return _layers_v1(header, meta, data, 8 + n, dtype, layers)
    raise Damaged(f"unknown format version {version!r}")


def header_length(first8: bytes, size: int) -> int:
    """Length of the JSON header from the first 8 bytes of a blob of `size` bytes."""
    if len(first8) < 8:
        raise Damaged("truncated")
    n = int.from_bytes(first8, "little")
    if n > min(size - 8, _MAX_HEADER):
        raise Damaged("header length beyond the file")
    return n


def decode_header(raw: bytes) -> tuple[dict, dict]:
    """(tensor entries, metadata) of a turborag cache header."""
    try:
        header = json.loads(raw)
    except ValueError as e:  # includes UnicodeDecodeError
        raise Damaged("unreadable header") from e
    if not isinstance(header, dict):
        raise Damaged("unreadable header")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or meta.get("format") != MAGIC:
        raise Damaged("not a turborag cache")
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


def _layers_v2(header: dict, meta: dict, data: memoryview, base: int, dtype, layers) -> Layers:
    try:
        n_layers, tokens = int(meta["layers"]), int(meta["tokens"])
    except (KeyError, TypeError, ValueError) as e:
        raise Damaged("layer or token count missing") from e
    names = {f"{kind}.{i}" for i in range(n_layers) for kind in "kv"}
    if n_layers < 1 or set(header) != names:
        raise Damaged("unexpected tensors")
    try:  # a truncated (or extended) blob, whichever layer it hits: safetensors data has no gaps
        complete = max(e["data_offsets"][1] for e in header.values()) == len(data)
    except (TypeError, KeyError, IndexError) as e:
        raise Damaged("bad offsets") from e
    if not complete:
        raise Damaged("data section size differs from the header")
    out: Layers = [None] * n_layers
    shapes = set()
    for i in _wanted(layers, n_layers):
        # Like the hashes, only the entries of requested tensors are checked: the others are not used, and
        # checking all of them would be most of the cost of a small request.
        pair = []
        for kind in "kv":
            e = _entry(f"{kind}.{i}", header[f"{kind}.{i}"], 3, data, base, dtype)
            shapes.add(e.shape)
            if len(shapes) > 1 or e.shape[1] != tokens:
                raise Damaged("tensor shapes differ")
            if xxh3(data[e.start : e.end]) != meta.get(f"xxh3.{e.name}"):
                raise Damaged(f"hash mismatch in {e.name}")
            pair.append(e.tensor(data))  # (H, T, D)
        out[i] = (pair[0], pair[1])
    return out


def _layers_v1(header: dict, meta: dict, data: memoryview, base: int, dtype, layers) -> Layers:
    if str(zlib.crc32(data)) != meta.get("crc32"):  # the whole data section: format 1 has one checksum
        raise Damaged("checksum mismatch")
    if set(header) != {"k", "v"}:
        raise Damaged("unexpected tensors")
    ek, ev = (_entry(name, header[name], 4, data, base, dtype) for name in ("k", "v"))
    if ek.shape != ev.shape or ek.shape[0] < 1:
        raise Damaged("tensor shapes differ")
    k, v = ek.tensor(data), ev.tensor(data)  # (L, H, T, D)
    wanted = set(_wanted(layers, ek.shape[0]))
    return [(k[i], v[i]) if i in wanted else None for i in range(ek.shape[0])]


def _wanted(layers: list[int] | None, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad:
        raise IndexError(f"layers {bad} requested from a cache of {n_layers} layers")
    return sorted(set(layers))


def _entry(name: str, entry, ndim: int, data: memoryview, base: int, dtype: torch.dtype) -> _Entry:
    """The header entry of one tensor, checked: store dtype, shape, offsets inside the data section and
    consistent with the shape, aligned for its dtype."""
    if not isinstance(entry, dict):
        raise Damaged(f"bad entry for {name}")
    found = _ST_DTYPES.get(entry.get("dtype"))
    if found != dtype:
        raise Damaged(f"{name} is {entry.get('dtype')}, the store holds {str(dtype).removeprefix('torch.')}")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not (isinstance(shape, list) and len(shape) == ndim and all(type(d) is int and d >= 0 for d in shape)):
        raise Damaged(f"bad shape for {name}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise Damaged(f"bad offsets for {name}")
    start, end = offsets
    itemsize = found.itemsize
    if not 0 <= start <= end <= len(data) or end - start != math.prod(shape) * itemsize:
        raise Damaged(f"offsets of {name} out of range")
    if (base + start) % itemsize:  # safetensors aligns every tensor; torch needs it
        raise Damaged(f"{name} misaligned")
    return _Entry(name, found, tuple(shape), start, end)
