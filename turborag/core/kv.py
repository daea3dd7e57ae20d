"""Chunk K/V caches: precompute behind the shared prefix, rotate to new positions, assemble.

Position math (invariants: docs/ARCHITECTURE.md). Let the prefix have p tokens and chunk i have n_i tokens.

- Precompute: chunk i is run at positions [p, p + n_i) with the prefix cache in front of it, so every
  chunk sees the same attention sink and instruction that it will see at serving time. Only the chunk's
  own K/V, shape (layers, kv_heads, n_i, head_dim), is kept.
- Keys are stored after RoPE. RoPE is a rotation by angle pos * inv_freq, and rotations compose, so the
  key of a token at position q rotated by d equals the key computed at position q + d. Values never change.
- `reordered` (default): chunk i is rotated by d_i = n_0 + ... + n_{i-1}, so the assembled context has
  contiguous positions p .. p + N - 1 as if it were one document; the question starts at p + N.
- `composite`: every chunk keeps [p, p + n_i) (d_i = 0); the question starts after the longest chunk,
  at p + max(n_i).

Worked example: prefix 3 tokens, chunks of 4 and 2 tokens.
    reordered: prefix 0..2 | chunk0 3..6 (d=0) | chunk1 7..8 (d=4) | question 9..
    composite: prefix 0..2 | chunk0 3..6       | chunk1 3..4       | question 7..

Sliding-window layers (Gemma 2/3, Mistral-style): a layer with window W lets a token at cache index i see
only indices > i - W. The assembled context has N entries, so the question's first token (index N), and
every later token, sees at most the last W - 1 context entries: at query time such a layer needs only the
tail [N - W + 1, N) of the context. Serving assembly holds just that tail for those layers (and the store is
never asked for the rest); the cache layer reports the dropped entries as an offset, so the model's mask,
which is built from indices, is exactly the mask of the whole context. Global layers keep everything.
    window 4, N = 9: a global layer holds 0..8; a sliding layer holds 6..8 (offset 6)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from turborag.core import hf_compat
from turborag.store.chunk_kv import ChunkKV

POSITION_MODES = ("reordered", "composite")

LayerKV = tuple[torch.Tensor, torch.Tensor]  # one layer of a span: keys and values, (kv_heads, T, head_dim)


def _stack(layers: list[hf_compat.KV], start: int, end: int, b: int = 0) -> ChunkKV:
    """Per-layer cache tensors -> one ChunkKV of tokens [start, end) of batch row b."""
    k = torch.stack([lk[b, :, start:end] for lk, _ in layers])  # (L, H, end-start, D)
    v = torch.stack([lv[b, :, start:end] for _, lv in layers])  # (L, H, end-start, D)
    return ChunkKV(k, v)


def to_cache(parts: Sequence[ChunkKV], batch: int = 1) -> hf_compat.DynamicCache:
    """Concatenate spans along time and wrap them as a model cache with a batch dim."""
    k = torch.cat([p.k for p in parts], dim=2)  # (L, H, N, D)
    v = torch.cat([p.v for p in parts], dim=2)  # (L, H, N, D)
    layers = [
        (k[i].unsqueeze(0).expand(batch, -1, -1, -1), v[i].unsqueeze(0).expand(batch, -1, -1, -1))
        for i in range(k.shape[0])
    ]
    return hf_compat.new_cache(layers)


def _grad_mode(grad: bool):
    """Serving runs under inference_mode; training runs the very same code with autograd on."""
    return torch.enable_grad() if grad else torch.inference_mode()


def prefill_prefix(model: torch.nn.Module, prefix_ids: list[int], grad: bool = False) -> ChunkKV:
    """K/V of the shared prefix at positions [0, p)."""
    dev = next(model.parameters()).device
    ids = torch.tensor([prefix_ids], device=dev)  # (1, p)
    cache = hf_compat.new_cache()
    with _grad_mode(grad):
        hf_compat.forward(
            model, ids, torch.arange(len(prefix_ids), device=dev)[None], cache, logits_to_keep=1
        )
        return _stack(hf_compat.cache_layers(cache), 0, len(prefix_ids))


def precompute_chunks(
    model: torch.nn.Module,
    prefix: ChunkKV,
    chunks: Sequence[list[int]],
    batch_size: int = 4,
    pad_id: int = 0,
    on_batch=None,
    grad: bool = False,
    on_chunk: Callable[[int, ChunkKV], None] | None = None,
) -> list[ChunkKV]:
    """K/V of each chunk computed behind the prefix at positions [p, p + n_i); returns them in input order.

    Chunks of similar length are batched together (sorted by length) and right-padded: under a causal mask,
    padding after a chunk never changes the chunk's own K/V. As each batch ends, `on_chunk(i, kv)` is called
    for each of its chunks (i: the index in `chunks`; a store writes it at once), then
    `on_batch(n_chunks, n_tokens)` (progress bars).
    """
    dev = next(model.parameters()).device
    p = prefix.tokens
    order = sorted(range(len(chunks)), key=lambda i: len(chunks[i]))
    out: list[ChunkKV | None] = [None] * len(chunks)
    prefix_dev = prefix.to(dev, next(model.parameters()).dtype)
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        width = max(len(chunks[i]) for i in idx)
        if width == 0:
            raise ValueError("cannot precompute an empty chunk")
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long, device=dev)  # (B, W)
        for row, i in enumerate(idx):
            ids[row, : len(chunks[i])] = torch.tensor(chunks[i], device=dev)
        pos = torch.arange(p, p + width, device=dev)[None].expand(len(idx), -1)  # (B, W)
        cache = to_cache([prefix_dev], batch=len(idx))
        with _grad_mode(grad):
            hf_compat.forward(model, ids, pos, cache, logits_to_keep=1)
            layers = hf_compat.cache_layers(cache)
            for row, i in enumerate(idx):
                out[i] = _stack(layers, p, p + len(chunks[i]), b=row)
        if on_chunk is not None:
            for i in idx:
                on_chunk(i, out[i])
        if on_batch is not None:
            on_batch(len(idx), sum(len(chunks[i]) for i in idx))
    return out  # type: ignore[return-value]


def rotate_into(out: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """rotate_keys' rotation, written straight into `out` (a view of a cache
    buffer, any dtype): no cast copy of k and no temporaries, which assembly of an 8k context would
    otherwise allocate and copy for every chunk of every layer. k, out (..., t, D), e.g. (H, t, D) or a group
    of layers (G, H, t, D); cos, sin broadcast against them ((1, D), (G, 1, 1, D)), their two halves equal
    (rotation()), so one product over all of k gives lo cos and hi cos at once: three kernels, not four (an
    8k context's keys, warm: 2.6 -> 2.2 ms)."""
    half = k.shape[-1] // 2
    s = sin[..., :half]
    torch.mul(k, cos, out=out)  # (lo cos, hi cos)
    out[..., :half].addcmul_(k[..., half:], s, value=-1)  # lo cos - hi sin
    out[..., half:].addcmul_(k[..., :half], s)  # hi cos + lo sin


def rotations(
    deltas: Sequence[int], inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin that move keys by each of `deltas` positions, per layer: inv_freq (L, D/2) fp64 ->
    (len(deltas), L, 1, 1, D), in a handful of kernels whatever the number of deltas (assembly has one per
    chunk).

    Angles are formed in fp64 so that large shifts (tens of thousands of positions) lose no precision
    before the cast to the key dtype.
    """
    d = torch.tensor(list(deltas), dtype=torch.float64, device=inv_freq.device)[:, None, None]  # (P, 1, 1)
    angle = d * inv_freq  # (P, L, D/2) fp64
    angle = torch.cat((angle, angle), dim=-1)[:, :, None, None, :]  # (P, L, 1, 1, D)
    return angle.cos().to(dtype), angle.sin().to(dtype)


def rotation(delta: int, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin that move keys by `delta` positions, per layer: inv_freq (L, D/2) fp64 -> (L, 1, 1, D)."""
    cos, sin = rotations([delta], inv_freq, dtype)
    return cos[0], sin[0]


def rotate_keys(k: torch.Tensor, delta: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Move keys by `delta` positions: k (L, H, T, D), inv_freq (L, D/2) fp64 -> (L, H, T, D)."""
    if delta == 0:
        return k
    cos, sin = rotation(delta, inv_freq.to(k.device), k.dtype)  # (L, 1, 1, D)
    # HF/NeoX RoPE pairs dimension j with j + D/2: k * cos + rotate_half(k) * sin, written per half in the
    # very arithmetic of rotate_into (serving), so the training path's cache equals serving's bit for bit
    half = k.shape[-1] // 2
    lo, hi = k[..., :half], k[..., half:]
    c, s = cos[..., :half], sin[..., :half]
    return torch.cat((torch.addcmul(lo * c, hi, s, value=-1), torch.addcmul(hi * c, lo, s)), dim=-1)


def layout(lengths: Sequence[int], prefix_len: int, positions: str = "reordered") -> tuple[list[int], int]:
    """Shift d_i of each chunk and the question's first position (see the module docstring)."""
    if positions not in POSITION_MODES:
        raise ValueError(f"unknown positions {positions!r}: use one of {POSITION_MODES}")
    if positions == "composite":
        return [0] * len(lengths), prefix_len + max(lengths, default=0)
    shifts, total = [], 0
    for n in lengths:
        shifts.append(total)
        total += n
    return shifts, prefix_len + total


def assemble(
    prefix: ChunkKV, chunks: Sequence[ChunkKV], inv_freq: torch.Tensor, positions: str = "reordered"
) -> tuple[hf_compat.DynamicCache, int]:
    """Prefix cache + re-positioned chunk caches -> (model cache, position of the first question token).

    Differentiable (plain concatenation): the training path. Serving uses `assemble_into`, which gives the
    same tensors written straight into preallocated buffers.
    """
    shifts, next_pos = layout([c.tokens for c in chunks], prefix.tokens, positions)
    parts = [prefix] + [ChunkKV(rotate_keys(c.k, d, inv_freq), c.v) for c, d in zip(chunks, shifts)]
    return to_cache(parts), next_pos


def window_start(n: int, window: int | None) -> int:
    """First context index a layer needs at query time, for a context of n entries: 0 for a global layer,
    n - (W - 1) for a sliding layer with window W (see the module docstring)."""
    return 0 if window is None else max(0, n - (window - 1))


def needed_layers(lengths: Sequence[int], prefix_len: int, windows: Sequence[int | None]) -> list[list[int]]:
    """For each chunk, the layers whose held tail overlaps it: global layers always, sliding layers only for
    chunks that end inside the window. The rest of a chunk's layers need not be read at all."""
    n = prefix_len + sum(lengths)
    starts = [window_start(n, w) for w in windows]
    out, end = [], prefix_len
    for length in lengths:
        end += length
        out.append([i for i, s in enumerate(starts) if end > s])
    return out


def _per_layer(part: ChunkKV | Sequence[LayerKV | None]) -> Sequence[LayerKV | None]:
    """A span as one (k, v) per layer: a ChunkKV's (L, H, T, D) tensors are split into views, no copy."""
    if isinstance(part, ChunkKV):
        return [(part.k[i], part.v[i]) for i in range(part.k.shape[0])]
    return part


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`. For a GPU it is staged through page-locked memory, so the copy is a DMA
    that does not make the host wait (non_blocking); on the CPU this is the tensor itself."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class StoredParts(Protocol):
    """A chunk whose cache is still in the store, open (store.kv_store.StoredChunk): assembly reads each
    tensor it needs, (kv_heads, T, head_dim), checked, into a tensor it gives."""

    def read_into(self, layer: int, kind: str, out: torch.Tensor) -> None: ...


def _read_group(
    part: StoredParts,
    idx: Sequence[int],
    skip: int,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    turn: tuple[torch.Tensor, torch.Tensor] | None,
    scratch: torch.Tensor,
) -> None:
    """Layers `idx` of a chunk still in the store into their place in the serving buffers, k_out and v_out
    (G, H, t, D). A tensor that goes in whole and as it is (values; keys that do not move) is read straight
    there. Keys that move, and a chunk of which the layers hold only the tail (`skip` tokens dropped), are
    read into `scratch`, which every chunk reuses (so it is still in the CPU's cache), and rotated or copied
    from there for all the layers of the group at once."""
    g, h, t, d = v_out.shape
    whole = scratch[: g * h * (skip + t) * d].view(g, h, skip + t, d)  # (G, H, T, D)
    for a, i in enumerate(idx):
        part.read_into(i, "v", whole[a] if skip else v_out[a])
    if skip:
        v_out.copy_(whole[:, :, skip:])
    if skip == 0 and turn is None:
        for a, i in enumerate(idx):
            part.read_into(i, "k", k_out[a])
        return
    for a, i in enumerate(idx):
        part.read_into(i, "k", whole[a])
    if turn is None:
        k_out.copy_(whole[:, :, skip:])
    else:
        rotate_into(k_out, whole[:, :, skip:], *turn)


def _write(
    part: Sequence[LayerKV | None],
    idx: Sequence[int],
    skip: int,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    turn: tuple[torch.Tensor, torch.Tensor] | None,
) -> None:
    """Layers `idx` of a chunk already read, one (k, v) per layer (H, T, D) in any dtype and on any device,
    cast, [rotated,] and written into k_out and v_out (G, H, t, D), a layer at a time."""
    device = k_out.device
    for a, i in enumerate(idx):
        k, v = part[i]  # (H, T, D)
        k = _to_device(k[:, skip:], device)  # (H, t, D), still in the stored dtype
        if turn is None:
            k_out[a] = k  # cast on copy
        else:
            rotate_into(k_out[a], k, turn[0][a], turn[1][a])
        v_out[a] = _to_device(v[:, skip:], device)  # cast on copy


def _groups(n: int, windows: Sequence[int | None]) -> dict[int, list[int]]:
    """The layers by the first context entry they hold (window_start): Gemma 3's 5 sliding layers in 6 form
    one group, its global layers another. A group's buffers are one tensor, so that a chunk's keys are
    rotated in one pass for all its layers."""
    groups: dict[int, list[int]] = {}
    for i, w in enumerate(windows):
        groups.setdefault(window_start(n, w), []).append(i)
    return groups


def assemble_into(
    prefix: ChunkKV,
    chunks: Sequence[ChunkKV | Sequence[LayerKV | None] | StoredParts],
    inv_freq: torch.Tensor,
    positions: str,
    device: torch.device,
    dtype: torch.dtype,
    reserve: int,
    windows: Sequence[int | None] | None = None,
    lengths: Sequence[int] | None = None,
) -> tuple[hf_compat.DynamicCache, int]:
    """Serving assembly: each chunk is cast, rotated and written once into per-layer buffers with `reserve`
    spare tokens for the question and the answer, so neither assembly nor decoding copies the context again.

    A chunk is a ChunkKV, one (k, v) per layer, (H, T, D), as the store reads them, or a chunk still in the
    store (StoredParts: on the CPU, in `dtype`), whose tensors are read straight into the buffers; a layer
    that a `windows` entry makes sliding holds only the context's tail, and its entries for chunks before
    the tail may be None (never read). `lengths` gives the chunks' token counts when no layer of a chunk was
    read. A stored chunk that fails its check raises the store's Damaged error: the buffers are then
    unusable.
    """
    n_layers, kv_heads, p, head_dim = prefix.k.shape
    windows = list(windows) if windows is not None else [None] * n_layers
    sizes = list(lengths) if lengths is not None else [c.tokens for c in chunks]
    shifts, next_pos = layout(sizes, p, positions)
    parts = [(_per_layer(prefix), p, 0)] + [(_per_layer(c), t, d) for c, t, d in zip(chunks, sizes, shifts)]
    n = p + sum(sizes)
    cos, sin = rotations([d for _, _, d in parts], inv_freq.to(device), dtype)  # (P, L, 1, 1, D)
    stored = [size for part, size, _ in parts if hasattr(part, "read_into")]
    scratch = torch.empty(n_layers * kv_heads * max(stored, default=0) * head_dim, device=device, dtype=dtype)
    layers: list = [None] * n_layers
    for start, idx in _groups(n, windows).items():  # these layers hold context entries [start, n)
        shape = (len(idx), 1, kv_heads, n - start + reserve, head_dim)
        k_buf = torch.empty(shape, device=device, dtype=dtype)  # (G, 1, H, capacity, D)
        v_buf = torch.empty_like(k_buf)
        ix = torch.tensor(idx, device=cos.device)
        group_cos, group_sin = cos[:, ix], sin[:, ix]  # (P, G, 1, 1, D)
        begin = 0  # cache index of the part's first token
        for j, (part, size, d) in enumerate(parts):
            skip = max(0, start - begin)  # leading tokens of this part that the layers do not hold
            if skip < size:
                dst = slice(begin + skip - start, begin + size - start)
                k_out, v_out = k_buf[:, 0, :, dst], v_buf[:, 0, :, dst]  # (G, H, t, D)
                turn = (group_cos[j], group_sin[j]) if d else None  # (G, 1, 1, D)
                if hasattr(part, "read_into"):
                    _read_group(part, idx, skip, k_out, v_out, turn, scratch)
                else:
                    _write(part, idx, skip, k_out, v_out, turn)
            begin += size
        for a, i in enumerate(idx):
            layers[i] = (k_buf[a], v_buf[a], n - start, start, windows[i] is not None)
    return hf_compat.buffered_cache_of(layers, reserve), next_pos
