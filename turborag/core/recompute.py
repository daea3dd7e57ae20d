"""Training-free accuracy recovery: recompute a few context tokens with attention to everything before them.

An assembled turbo cache is exact for the prefix and the first chunk, but every later chunk's K/V was
computed without seeing the chunks before it. Recomputing a small set S of context tokens fixes the
cross-chunk attention where it matters most, at a fraction of a full prefill:

- `epic` (EPIC-style attention-sink fix): S = the first k tokens of every chunk after the first. Those
  tokens act as each chunk's local attention sink; seen fresh, they tie the chunk to what precedes it.
- `blend` (CacheBlend-style): S = the `ratio` share of context tokens whose cached K/V deviates most from
  the K/V a full prefill would give. The deviation is measured on layer 1 (layer 0 keys depend only on the
  token, so they never deviate), by a full prefill of the first two layers only.

Both recompute S in ONE forward on top of the assembled cache: the tokens of S are run at their own
positions, each seeing (a) every cached token before it that is not in S and (b) the fresh versions of the
S tokens before it (their stale cached copies are masked out). Their new K/V then replace the stale ones
in every layer. The sliding window of sliding-attention layers is applied by sequence index, as in a
full prefill.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from turborag.core import hf_compat

STRATEGIES = ("epic", "blend")


def epic_indices(prefix_len: int, lengths: Sequence[int], k: int) -> list[int]:
    """Cache indices of the first k tokens of every chunk after the first."""
    out, start = [], prefix_len
    for i, n in enumerate(lengths):
        if i > 0:
            out.extend(range(start, start + min(k, n)))
        start += n
    return out


def _mask(
    selected: torch.Tensor, n_cache: int, sliding_window: int | None, dev: torch.device
) -> torch.Tensor:
    """(1, 1, |S|, n_cache + |S|) bool: which keys each recomputed token sees (see module docstring)."""
    s = selected[:, None]  # (S, 1) cache index of each query
    j = torch.arange(n_cache, device=dev)[None, :]  # (1, N)
    in_s = torch.zeros(n_cache, dtype=torch.bool, device=dev)
    in_s[selected] = True
    old = (j < s) & ~in_s[None, :]  # (S, N): earlier cached tokens, stale copies of S excluded
    new = selected[None, :] <= s  # (S, S): fresh S tokens up to and including itself
    if sliding_window is not None:
        old &= (s - j) < sliding_window
        new &= (s - selected[None, :]) < sliding_window
    return torch.cat([old, new], dim=1)[None, None]


def recompute(
    model: torch.nn.Module,
    cache: hf_compat.DynamicCache,
    ids: Sequence[int],  # token id at every cache index (prefix + chunks), length N
    positions: Sequence[int],  # RoPE position at every cache index, length N
    selected: Sequence[int],  # cache indices to recompute
) -> None:
    """Recompute the K/V of `selected` cache entries in place."""
    if not selected:
        return
    dev = next(model.parameters()).device
    sel = torch.tensor(sorted(set(selected)), device=dev)  # (S,)
    n = len(ids)
    x = torch.tensor(ids, device=dev)[sel][None]  # (1, S)
    pos = torch.tensor(positions, device=dev)[sel][None]  # (1, S)
    cfg = model.config
    full = _mask(sel, n, None, dev)
    mask = full
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
        mask = {"full_attention": full, "sliding_attention": _mask(sel, n, cfg.sliding_window, dev)}
    with torch.inference_mode():
        hf_compat.forward(model, x, pos, cache, attention_mask=mask, logits_to_keep=1)
        hf_compat.move_tail(cache, sel, n)


@torch.inference_mode()
def blend_indices(
    model: torch.nn.Module,
    cache: hf_compat.DynamicCache,
    ids: Sequence[int],
    positions: Sequence[int],
    first: int,  # first cache index eligible (the first chunk is exact; earlier tokens never deviate)
    ratio: float,
) -> list[int]:
    """The `ratio` share of tokens in [first, N) whose layer-1 K/V deviates most from a full prefill's."""
    n = len(ids)
    count = int(round(ratio * (n - first)))
    if count <= 0:
        return []
    dev = next(model.parameters()).device
    ref = hf_compat.new_cache()
    x = torch.tensor([list(ids)], device=dev)  # (1, N)
    with hf_compat.first_layers(model, 2):
        hf_compat.forward(model, x, torch.tensor([list(positions)], device=dev), ref, logits_to_keep=1)
    k_ref, v_ref = hf_compat.cache_layers(ref)[1]  # (1, H, N, D) fresh
    k_old, v_old = hf_compat.cache_layers(cache)[1]  # (1, H, N, D) assembled
    dev_k = (k_ref - k_old).float().norm(dim=-1).sum(dim=1)[0]  # (N,)
    dev_v = (v_ref - v_old).float().norm(dim=-1).sum(dim=1)[0]  # (N,)
    score = (dev_k + dev_v)[first:]
    top = torch.topk(score, min(count, score.numel())).indices + first
    return sorted(top.tolist())
