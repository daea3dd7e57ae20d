"""The bytes of one chunk cache: a self-describing, hash-checked safetensors blob, never pickle.

Any backend stores these blobs as they are (a file, a Redis value), so what a blob means and how it is checked
lives here, once.

Format 2 (what `encode` writes): one tensor per layer and kind, `k.{i}` and `v.{i}`, each (kv_heads, T,
head_dim) in the store's format, and in the safetensors metadata `format: turborag-kv`, `version: "2"`,
`layers`, `tokens` and one xxh3-64 hash per tensor (`xxh3.k.{i}`, hex).

- Per-layer tensors: a request reads only the layers it needs. With Gemma 3 most chunks of a long context
  only matter to the global-attention layers (a sliding-window layer sees the last 511 positions), so a
  request typically needs 3 of 18 layers; with one stacked tensor it would read all 18.
- A hash per tensor: verification covers exactly what is read, at memory speed (xxh3 runs at tens of
  GB/s, CRC32 in zlib at ~1), so checking never costs more than the read it guards. A damaged tensor that
  is never requested is never used either; it is caught when it is requested, or by `cache verify`.
- Decoding reads a blob in ranges (`Blob`): the header, then each requested tensor. From a file
  (backends.FileBlob) that is one pread per tensor into its own buffer; from bytes already in memory (a
  Redis value) a zero-copy view. A cast format's tensors are then views over those bytes, so a requested
  layer costs its read, one pass for the hash, and whatever the caller does with it.
- Or a blob is opened (`open_reader`) and each tensor read into a tensor the caller gives (`TensorReader`):
  serving assembly reads them straight into the buffers that serve them, a tensor with one preadv, and
  hashes them there, so no tensor is copied twice.

Store formats (`FORMATS`): `float16`, `bfloat16`, `float32` store the tensors cast to that dtype. `int8` and
`fp8` store them quantized, 1 byte per element plus scales (`tensor_bytes`: int8 is 0.5 + 1/(2 head_dim) +
1/(2 T) of float16, 0.504 for Gemma 3's head_dim 256 at T = 256 tokens; fp8 0.500); the blob's metadata says
`quant: int8|fp8`, each layer adds the scale tensors `ks.{i}` and `vs.{i}` (bfloat16, hashed like the
others), and decoding returns the requested layers dequantized to float16 (`decoded_dtype`), new tensors
rather than views. x ~= q * scale, symmetric (no zero point):

- `int8` (KIVI, arXiv 2402.02750): keys per channel, `ks.{i}` (H, 1, D), one scale per head and dimension over
  the chunk's tokens; values per token, `vs.{i}` (H, T, 1), one scale per head and token over head_dim.
  Keys have outlier channels (a few dimensions 10-100x the others, the same in every token), so a per-token
  scale would spend the 8 bits on them; values have no such channels but vary per token. Keys are stored
  after RoPE, which mixes dimension j with j + D/2 at a per-token angle, so a channel's scale covers the
  magnitude of its rotated pair: it still works (measured on keys with outlier channels rotated at 256
  positions: 0.8% relative error per channel scale, 1.4-2.4% per token scale).
- `fp8` (vLLM's fp8 KV cache): float8 e4m3 (3 mantissa bits, max 448), `ks.{i}` and `vs.{i}` (H, 1, 1), one
  scale per head and kind (amax / 448). A float format keeps its relative precision over 15 binades, so finer
  scales barely help (measured: 2.6% with per-head scales, 2.5% with KIVI's), and int8 is 4x more precise at
  the same size: fp8 exists for parity with fp8 serving stacks, int8 is the one to use.

Scales are rounded *up* to bfloat16 (never down, so |x / scale| stays within the int8 or fp8 range) and
quantization divides by the rounded scale, so the error bound is that of the stored scale: round(x / s) * s is
within s / 2 of x. Decoded float16 rather than bfloat16: q * s carries up to 16 significant bits, float16
keeps 11 of them (rounding error 1/16 of an int8 step), bfloat16 8 (up to half a step near a channel's
maximum; measured: +0.05% vs +4% on int8's error). K/V values are far inside float16's range (inputs are
clipped at +-60000 so that the dequantized values stay finite). Assembly casts to the compute dtype anyway.

`as_stored` gives what a put followed by a read returns (cast, or quantized and dequantized, on the CPU
exactly as `encode` and `decode` do), so a chunk computed during a request is numerically the one that later
requests read.

Format 1 (written by early versions, still read): tensors `k` and `v`, (layers, kv_heads, T, head_dim), and a
CRC32 of the whole data section; reading it checks the whole blob, whatever is asked for. Never quantized.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass
from typing import Protocol

import torch
import xxhash
from safetensors.torch import save as st_save

from turborag.store.chunk_kv import ChunkKV

FILE_FORMAT = "2"  # what encode writes; decode also reads format "1"
MAGIC = "turborag-kv"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}  # cast formats
QUANT = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}  # quantized formats: the dtype of q
FORMATS = (*DTYPES, *QUANT)  # every store format
SCALE_DTYPE = torch.bfloat16  # the scales of a quantized blob: float32's range in 2 bytes
DECODED = torch.float16  # what a quantized blob decodes to (see the module docstring)
_QMAX = {"int8": 127.0, "fp8": 448.0}  # largest |q|: symmetric int8 (-128 unused), e4m3's largest finite
_CLIP = 60000.0  # |x| beyond this is clipped before quantizing, so that q * scale stays finite in float16
_ST_DTYPES = {
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "I8": torch.int8,
    "F8_E4M3": torch.float8_e4m3fn,
}
_MAX_HEADER = 100_000_000  # safetensors' own limit: a larger length is damage, not a header to read

Layers = list[tuple[torch.Tensor, torch.Tensor] | None]


class Damaged(Exception):
    """A blob that must not be used; the message says what is wrong with it."""


def xxh3(buf) -> str:
    return xxhash.xxh3_64_hexdigest(buf)


def _format_name(fmt: str | torch.dtype) -> str:
    """A store format name; a torch dtype (what callers passed before quantized formats) is a cast format."""
    if isinstance(fmt, torch.dtype):
        for name, dtype in DTYPES.items():
            if dtype == fmt:
                return name
    elif fmt in FORMATS:
        return fmt
    raise ValueError(f"unknown store format {fmt!r}: use one of {', '.join(FORMATS)}")


def decoded_dtype(fmt: str | torch.dtype) -> torch.dtype:
    """The dtype that `decode` and `as_stored` return for a store format."""
    fmt = _format_name(fmt)
    return DTYPES[fmt] if fmt in DTYPES else DECODED


def tensor_bytes(fmt: str | torch.dtype, layers: int, kv_heads: int, tokens: int, head_dim: int) -> int:
    """Bytes of a chunk's tensors in a blob of this format, scales included (the header is not counted)."""
    fmt = _format_name(fmt)
    n = 2 * layers * kv_heads * tokens * head_dim  # K and V elements
    if fmt in DTYPES:
        return n * DTYPES[fmt].itemsize
    scales = (head_dim + tokens) if fmt == "int8" else 2  # per (layer, head): K per channel + V per token
    return n + layers * kv_heads * scales * SCALE_DTYPE.itemsize


# -- quantization --------------------------------------------------------------------------------------------


def _scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """amax / qmax rounded up to SCALE_DTYPE: dividing by it keeps |x| / scale <= qmax."""
    s = (amax / qmax).clamp_min(torch.finfo(torch.float32).tiny)  # an all-zero row divides by a tiny scale
    r = s.to(SCALE_DTYPE)
    return torch.where(r.float() < s, torch.nextafter(r, torch.full_like(r, math.inf)), r)


def _quantize(x: torch.Tensor, fmt: str, over: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., T, D) -> (q in QUANT[fmt], scale in SCALE_DTYPE), one scale per reduction over the dims `over`
    (kept as size 1, so that q * scale broadcasts back)."""
    x = x.detach().to("cpu", torch.float32).clamp(-_CLIP, _CLIP)
    scale = _scale(x.abs().amax(dim=over, keepdim=True), _QMAX[fmt])
    y = x / scale.float()
    if fmt == "int8":
        return y.round().clamp(-127, 127).to(torch.int8), scale
    # The clamp: the division can land an ulp above 448, and casts beyond it are not saturating everywhere.
    return y.clamp(-448, 448).to(torch.float8_e4m3fn), scale


def quantize(kv: ChunkKV, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k_q, v_q, k_scale, v_scale) of a stacked chunk cache, on the CPU. k_q, v_q: (L, H, T, D). Scales:
    int8 k (L, H, 1, D) per channel and v (L, H, T, 1) per token; fp8 (L, H, 1, 1) per head.

    Every step is elementwise or a max, so quantizing a stack equals quantizing its layers one at a time."""
    if kv.k.shape[2] == 0:
        raise ValueError("cannot quantize an empty chunk")
    if fmt == "int8":
        (kq, ks), (vq, vs) = _quantize(kv.k, fmt, (2,)), _quantize(kv.v, fmt, (3,))
    else:
        (kq, ks), (vq, vs) = _quantize(kv.k, fmt, (2, 3)), _quantize(kv.v, fmt, (2, 3))
    return kq, vq, ks, vs


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q * scale in DECODED, through float32 (one rounding): any shape, scale broadcast over q."""
    return (q.to(torch.float32) * scale.to(torch.float32)).to(DECODED)


def as_stored(kv: ChunkKV, fmt: str | torch.dtype) -> ChunkKV:
    """What `decode(encode(kv, fmt), fmt)` returns, stacked (L, H, T, D), on kv's device.

    A cast format casts where kv is (a correctly rounded cast gives the same values on any device); a
    quantized one runs on the CPU, as `encode` does, so that the result is bit-identical to a read."""
    fmt = _format_name(fmt)
    if fmt in DTYPES:
        return ChunkKV(kv.k.to(DTYPES[fmt]), kv.v.to(DTYPES[fmt]))
    kq, vq, ks, vs = quantize(kv, fmt)
    return ChunkKV(dequantize(kq, ks).to(kv.k.device), dequantize(vq, vs).to(kv.v.device))


# -- writing -------------------------------------------------------------------------------------------------


def encode(kv: ChunkKV, fmt: str | torch.dtype) -> bytes:
    """Format 2 bytes of `kv` in a store format (a name from FORMATS, or the torch dtype of a cast format)."""
    fmt = _format_name(fmt)
    if kv.k.dim() != 4 or kv.k.shape != kv.v.shape:
        raise ValueError(f"K and V must be (layers, kv_heads, T, head_dim), got {kv.k.shape}, {kv.v.shape}")
    layers, _, tokens, _ = kv.k.shape
    meta = {"format": MAGIC, "version": FILE_FORMAT, "layers": str(layers), "tokens": str(tokens)}
    if fmt in DTYPES:
        stacks = {"k": kv.k.detach().to("cpu", DTYPES[fmt]), "v": kv.v.detach().to("cpu", DTYPES[fmt])}
    else:
        kq, vq, ks, vs = quantize(kv, fmt)
        stacks = {"k": kq, "v": vq, "ks": ks, "vs": vs}
        meta["quant"] = fmt
    tensors: dict[str, torch.Tensor] = {}
    for i in range(layers):
        for kind, stacked in stacks.items():
            # A copy per layer: some safetensors versions refuse tensors that share a storage, and the
            # write path is not the hot one.
            t = stacked[i].clone(memory_format=torch.contiguous_format)  # (H, T, D), a scale (H, 1|T, 1|D)
            tensors[f"{kind}.{i}"] = t
            meta[f"xxh3.{kind}.{i}"] = xxh3(t.view(torch.uint8).numpy())  # the bytes as stored
    return st_save(tensors, metadata=meta)


# -- reading -------------------------------------------------------------------------------------------------


class Blob(Protocol):
    """A blob that is read in ranges, so that decoding copies only what it checks and returns: a file
    (backends.FileBlob) reads each range with one pread. `read_range` gives a writable buffer of bytes
    [start, end), or fewer where the blob ends before `end`. `read_into` fills the caller's writable buffers
    in order with the bytes from `start` on and returns how many it filled (fewer where the blob ends)."""

    def __len__(self) -> int: ...

    def read_range(self, start: int, end: int): ...

    def read_into(self, start: int, bufs: list) -> int: ...


class BufferBlob:
    """A blob already in memory (bytes read from Redis, a test's bytes): ranges are zero-copy views."""

    def __init__(self, buf):
        self.view = memoryview(buf).cast("B")

    def __len__(self) -> int:
        return len(self.view)

    def read_range(self, start: int, end: int) -> memoryview:
        return self.view[start:end]

    def read_into(self, start: int, bufs: list) -> int:
        done = 0
        for buf in bufs:
            out = memoryview(buf).cast("B")
            src = self.view[start + done : start + done + len(out)]
            out[: len(src)] = src
            done += len(src)
            if len(src) < len(out):
                break
        return done


def as_blob(buf) -> Blob:
    """`buf` as a Blob: a Blob as it is, any buffer (bytes, bytearray, mmap) wrapped."""
    return buf if hasattr(buf, "read_range") else BufferBlob(buf)


def _read(blob: Blob, start: int, end: int):
    """Bytes [start, end) of the blob, all of them: a short read (a file cut while read) is damage."""
    raw = blob.read_range(start, end)
    if len(raw) != end - start:
        raise Damaged("truncated")
    return raw


def blob_format(buf) -> str | None:
    """The format, "1" or "2", read from the header only; None if unreadable."""
    try:
        _, meta, _ = _header(as_blob(buf))
    except Damaged:
        return None
    version = meta.get("version")
    return version if version in ("1", "2") else None


def _header(blob: Blob) -> tuple[dict, dict, int]:
    """(tensor entries, metadata, offset of the data section) of a blob."""
    if len(blob) < 8:
        raise Damaged("truncated")
    n = header_length(bytes(_read(blob, 0, 8)), len(blob))
    header, meta = decode_header(bytes(_read(blob, 8, 8 + n)))
    return header, meta, 8 + n


def decode(buf, fmt: str | torch.dtype, layers: list[int] | None = None) -> Layers:
    """Per-layer (k, v), each (kv_heads, T, head_dim), for the layer indices asked for (all if None); other
    entries are None, their bytes neither read nor checked. `buf` is a buffer or a Blob (as_blob). From a
    buffer, a cast format gives views over it (a writable buffer that must outlive them); from a Blob, each
    tensor has its own buffer, a copy of just its bytes. A quantized format gives new tensors in
    `decoded_dtype(fmt)`. Raises Damaged for anything that is not a sound blob of the store format `fmt` (a
    blob of another format included), and IndexError for a layer outside the cache (the caller's error, not
    damage)."""
    fmt = _format_name(fmt)
    blob = as_blob(buf)
    header, meta, base = _header(blob)
    data = _Section(blob, base)  # the data section: offsets in the header are relative to it
    version = meta.get("version")
    if version == "2":
        return _layers_v2(header, meta, data, fmt, layers)
    if version == "1":
        if fmt not in DTYPES:
            raise Damaged(f"a format-1 blob is never quantized, the store holds {fmt}")
        return _layers_v1(header, meta, data, DTYPES[fmt], layers)
    raise Damaged(f"unknown format version {version!r}")


@dataclass(frozen=True)
class _Section:
    """The data section of a blob, from byte `base` to the end; offsets are relative to its start."""

    blob: Blob
    base: int

    def __len__(self) -> int:
        return len(self.blob) - self.base

    def read(self, start: int, end: int):
        return _read(self.blob, self.base + start, self.base + end)


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

    def tensor(self, raw) -> torch.Tensor:
        """The tensor over `raw`, its own bytes (a writable buffer, read from the data section): no copy."""
        numel = math.prod(self.shape)
        if numel == 0:  # frombuffer refuses an empty count
            return torch.empty(self.shape, dtype=self.dtype)
        return torch.frombuffer(raw, dtype=self.dtype, count=numel).view(self.shape)


def _scale_shape(fmt: str, kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of a layer's K ("ks") or V ("vs") scale for q of `shape` (H, T, D)."""
    h, t, d = shape
    if fmt == "fp8":
        return (h, 1, 1)  # per head
    return (h, 1, d) if kind == "ks" else (h, t, 1)  # int8: K per channel, V per token


@dataclass(frozen=True)
class _Index:
    """A format-2 blob's header, checked as a whole (the tensors it names, the data section's size). Each
    tensor's own entry is checked when that tensor is read, and its bytes against its hash."""

    header: dict
    meta: dict
    data: _Section
    quant: str | None
    kinds: tuple[str, ...]
    n_layers: int
    tokens: int
    dtype: torch.dtype  # of k and v as stored (of q in a quantized format)

    def entry(self, kind: str, layer: int) -> _Entry:
        name = f"{kind}.{layer}"
        e = _entry(name, self.header[name], 3, self.data, SCALE_DTYPE if kind in ("ks", "vs") else self.dtype)
        if kind in ("k", "v") and e.shape[1] != self.tokens:
            raise Damaged("tensor shapes differ")
        return e

    def check(self, name: str, digest: str) -> None:
        if digest != self.meta.get(f"xxh3.{name}"):
            raise Damaged(f"hash mismatch in {name}")


def _index_v2(header: dict, meta: dict, data: _Section, fmt: str) -> _Index:
    quant = meta.get("quant")
    if quant != (fmt if fmt in QUANT else None):
        found = f"quantized as {quant}" if quant else "not quantized"
        raise Damaged(f"the blob is {found}, the store holds {fmt}")
    try:
        n_layers, tokens = int(meta["layers"]), int(meta["tokens"])
    except (KeyError, TypeError, ValueError) as e:
        raise Damaged("layer or token count missing") from e
    kinds = ("k", "v", "ks", "vs") if quant else ("k", "v")
    names = {f"{kind}.{i}" for i in range(n_layers) for kind in kinds}
    if n_layers < 1 or set(header) != names:
        raise Damaged("unexpected tensors")
    try:  # a truncated (or extended) blob, whichever layer it hits: safetensors data has no gaps
        complete = max(e["data_offsets"][1] for e in header.values()) == len(data)
    except (TypeError, KeyError, IndexError) as e:
        raise Damaged("bad offsets") from e
    if not complete:
        raise Damaged("data section size differs from the header")
    dtype = QUANT[fmt] if quant else DTYPES[fmt]
    return _Index(header, meta, data, quant, kinds, n_layers, tokens, dtype)


def _layers_v2(header: dict, meta: dict, data: _Section, fmt: str, layers) -> Layers:
    index = _index_v2(header, meta, data, fmt)
    out: Layers = [None] * index.n_layers
    shapes = set()
    for i in _wanted(layers, index.n_layers):
        # Like the hashes, only the entries of requested tensors are checked: the others are not used, and
        # checking all of them would be most of the cost of a small request.
        t = {}
        for kind in index.kinds:
            e = index.entry(kind, i)
            if kind in ("k", "v"):
                shapes.add(e.shape)
                if len(shapes) > 1:
                    raise Damaged("tensor shapes differ")
            elif e.shape != _scale_shape(fmt, kind, t["k"].shape):
                raise Damaged(f"bad shape for {e.name}")
            raw = data.read(e.start, e.end)
            index.check(e.name, xxh3(raw))
            t[kind] = e.tensor(raw)  # (H, T, D), a scale (H, 1|T, 1|D)
        if index.quant:
            out[i] = (dequantize(t["k"], t["ks"]), dequantize(t["v"], t["vs"]))
        else:
            out[i] = (t["k"], t["v"])
    return out


class TensorReader:
    """A format-2 blob of a cast format, opened so that serving assembly (kv.assemble_into) reads each tensor
    it needs straight into the buffer that will serve it, checking the hash on the way: no buffer of its own
    per tensor, and no second copy. `open_reader` makes one; the header is checked on opening, each tensor
    when it is read."""

    def __init__(self, index: _Index):
        self._index = index
        self.layers = index.n_layers
        self.tokens = index.tokens

    def read_into(self, layer: int, kind: str, out: torch.Tensor) -> None:
        """Tensor `kind` ("k" or "v") of `layer`, (H, T, D), read into `out`: a CPU tensor of that shape and
        the store's dtype whose rows of each head are contiguous (a slice [0, :, a:b] of a (1, H, N, D)
        buffer). Raises Damaged where the tensor fails its hash (`out` then holds unchecked bytes: the caller
        must not use it); IndexError for a layer the blob lacks and ValueError for an `out` of another shape
        (the caller's errors: the blob is kept)."""
        if kind not in ("k", "v"):
            raise ValueError(f"kind must be 'k' or 'v', got {kind!r}")
        if not 0 <= layer < self.layers:
            raise IndexError(f"layer {layer} requested from a cache of {self.layers} layers")
        e = self._index.entry(kind, layer)
        if out.dtype != e.dtype or out.device.type != "cpu":
            raise ValueError(f"read_into needs a CPU tensor of {e.dtype}, got {out.dtype} on {out.device}")
        if e.shape != tuple(out.shape):  # a sound blob read into the wrong place: the caller's error
            raise ValueError(f"{e.name} is {list(e.shape)}, read_into was given {list(out.shape)}")
        pieces = [_bytes_of(out[h]) for h in range(out.shape[0])]  # one (T, D) run of bytes per head
        if self._index.data.blob.read_into(self._index.data.base + e.start, pieces) != e.end - e.start:
            raise Damaged("truncated")
        h = xxhash.xxh3_64()
        for piece in pieces:
            h.update(piece)
        self._index.check(e.name, h.hexdigest())


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable, with no copy."""
    if not t.is_contiguous():
        raise ValueError("read_into needs each head's rows contiguous")
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


def open_reader(buf, fmt: str | torch.dtype) -> TensorReader | None:
    """A TensorReader over a blob of the store format `fmt` (a cast format), or None for a format-1 blob,
    which has no per-tensor hashes (decode it whole). Raises Damaged for anything that is not a sound blob of
    that format, as `decode` does."""
    fmt = _format_name(fmt)
    if fmt not in DTYPES:
        raise ValueError(f"a {fmt} blob is dequantized, not read in place")
    blob = as_blob(buf)
    header, meta, base = _header(blob)
    version = meta.get("version")
    if version == "1":
        return None
    if version != "2":
        raise Damaged(f"unknown format version {version!r}")
    return TensorReader(_index_v2(header, meta, _Section(blob, base), fmt))


def _layers_v1(header: dict, meta: dict, data: _Section, dtype, layers) -> Layers:
    raw = memoryview(data.read(0, len(data)))
    if str(zlib.crc32(raw)) != meta.get("crc32"):  # the whole data section: format 1 has one checksum
        raise Damaged("checksum mismatch")
    if set(header) != {"k", "v"}:
        raise Damaged("unexpected tensors")
    ek, ev = (_entry(name, header[name], 4, data, dtype) for name in ("k", "v"))
    if ek.shape != ev.shape or ek.shape[0] < 1:
        raise Damaged("tensor shapes differ")
    k, v = ek.tensor(raw[ek.start : ek.end]), ev.tensor(raw[ev.start : ev.end])  # (L, H, T, D)
    wanted = set(_wanted(layers, ek.shape[0]))
    return [(k[i], v[i]) if i in wanted else None for i in range(ek.shape[0])]


def _wanted(layers: list[int] | None, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad:
        raise IndexError(f"layers {bad} requested from a cache of {n_layers} layers")
    return sorted(set(layers))


def _entry(name: str, entry, ndim: int, data: _Section, dtype: torch.dtype) -> _Entry:
    """The header entry of one tensor, checked: the dtype the store format gives it, shape, offsets inside
    the data section and consistent with the shape, aligned for its dtype."""
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
    if (data.base + start) % itemsize:  # safetensors aligns every tensor (torch needs it in a view)
        raise Damaged(f"{name} misaligned")
    return _Entry(name, found, tuple(shape), start, end)
