"""Prefill forwards of several requests in one forward: the batched question prefill of the server.

A forward of a small model over a few dozen tokens is bound by reading the weights, not by arithmetic
(Gemma 3 270M in fp32: ~1 GB of weights per forward, and a 23-token question prefill ran at 30 GFLOP/s
against this CPU's ~146). So the questions of requests admitted together are cheaper in one forward than in
one forward each: the weights are read once.

A `Feed` is one prefill forward a request asks for: its `ids` at positions `start`.. on top of its own
`cache` (an assembled turbo context, or the tokens of a full prompt before them), of which the logits of the
last `keep` tokens are wanted. `Feed.run` runs it alone; `feed_together` runs several in one forward:

- per layer, a temporary buffer (B, H, C + T, D) holds each row's cache entries right-aligned to a common
  end C (left padding, zeros), followed by T = max(len(ids)) slots for the new tokens;
- a row with fewer than T new tokens is left-padded inside those slots as well, so every row's last token
  is at C + T - 1 (where the kept logits are read):

      row 0:  . . c c c c c c | . . q q      (2 context entries of padding, 2 query slots of padding)
      row 1:  c c c c c c c c | q q q q

- the mask of a row's query sees its own entries and its own earlier new tokens, never padding; on a
  sliding layer it sees keys less than W cache indices behind it, counted in the row's own cache (the
  padding between its context and its new tokens does not count). Padding queries see their row's first
  entry only (a query that sees nothing would be NaN), and their outputs are dropped;
- afterwards each row's own cache gets its new entries appended, exactly as its own forward would have
  left it; the temporary buffers are dropped.

Position ids are per row, so requests with unrelated positions (turbo re-positioned contexts of any
length) share the forward. Tested equal to one forward per request (tests/core/test_feeds.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from turborag.core import ape, hf_compat, query_adapter


@dataclass
class Feed:
    """One request's prefill forward: `ids` at positions start.. on top of `cache`; logits of the last
    `keep` tokens wanted. `attention` is the APE context of a turbo-ape request (such feeds run alone)."""

    model: torch.nn.Module
    cache: hf_compat.DynamicCache
    ids: list[int]
    start: int
    keep: int
    attention: ape.ApeContext | None = None
    adapter: bool = False

    @property
    def tokens(self) -> int:
        return len(self.ids)

    @torch.inference_mode()
    def run(self) -> torch.Tensor:
        """The forward alone; the logits of the last `keep` tokens (keep, vocab)."""
        dev = next(self.model.parameters()).device
        x = torch.tensor([self.ids], device=dev)  # (1, T)
        pos = torch.arange(self.start, self.start + len(self.ids), device=dev)[None]  # (1, T)
        extra = {"ape": self.attention} if self.attention is not None else {}
        ape_on = ape.enabled(self.model) if self.attention is not None else contextlib.nullcontext()
        with ape_on, query_adapter.active(self.model, self.adapter):
            return hf_compat.forward(self.model, x, pos, self.cache, logits_to_keep=self.keep, **extra)[0]


def together(feed: Feed) -> bool:
    """Whether a feed may share a forward: plain attention (APE's context spans are per request), on a
    cache that holds entries already (a prompt's first forward, on an empty cache, runs alone)."""
    return feed.attention is None and all(layer.is_initialized for layer in feed.cache.layers)


@torch.inference_mode()
def feed_together(feeds: list[Feed], windows: list[int | None]) -> list[torch.Tensor]:
    """Run the feeds (one model, plain attention) in one forward; each one's logits (keep, vocab), and each
    one's cache left as its own forward would have left it. `windows`: per layer, the sliding window or
    None."""
    if len(feeds) == 1:
        return [feeds[0].run()]
    if not all(together(f) for f in feeds):
        raise ValueError("a turbo-ape feed, or one on an empty cache, runs alone")
    model = feeds[0].model
    dev = next(model.parameters()).device
    rows, width = len(feeds), max(f.tokens for f in feeds)
    pad = [width - f.tokens for f in feeds]  # padding slots before each row's new tokens
    ids = torch.zeros(rows, width, dtype=torch.long, device=dev)  # (B, T)
    pos = torch.zeros(rows, width, dtype=torch.long, device=dev)  # (B, T)
    for b, f in enumerate(feeds):
        ids[b, pad[b] :] = torch.tensor(f.ids, device=dev)
        pos[b] = f.start  # padding slots: any position (their outputs are dropped)
        pos[b, pad[b] :] = torch.arange(f.start, f.start + f.tokens, device=dev)
    layers, firsts, ends = [], [], []
    for i in range(len(windows)):
        held = [(f.cache.layers[i].keys[0], f.cache.layers[i].values[0]) for f in feeds]  # (H, n, D) each
        end = max(k.shape[1] for k, _ in held)
        k0, v0 = held[0]
        k_buf = torch.zeros(rows, k0.shape[0], end + width, k0.shape[2], dtype=k0.dtype, device=dev)
        v_buf = torch.zeros(rows, v0.shape[0], end + width, v0.shape[2], dtype=v0.dtype, device=dev)
        for b, (k, v) in enumerate(held):
            k_buf[b, :, end - k.shape[1] : end] = k
            v_buf[b, :, end - v.shape[1] : end] = v
        layers.append((k_buf, v_buf, end, 0, False))
        firsts.append([end - k.shape[1] for k, _ in held])
        ends.append(end)
    cache = hf_compat.buffered_cache_of(layers, reserve=0)
    eager = getattr(model.config, "_attn_implementation", "sdpa") == "eager"
    masks: dict[int | None, torch.Tensor] = {}
    for i, w in enumerate(windows):
        if w not in masks:
            masks[w] = _mask(firsts[i], ends[i], pad, width, w, dev, layers[i][0].dtype, eager)
    mask = (
        next(iter(masks.values()))
        if len(masks) == 1
        else {("sliding_attention" if w is not None else "full_attention"): m for w, m in masks.items()}
    )
    keep = max(f.keep for f in feeds)
    with query_adapter.active(model, [f.adapter for f in feeds]):
        logits = hf_compat.forward(model, ids, pos, cache, attention_mask=mask, logits_to_keep=keep)
    # logits: (B, K, V)
    for i in range(len(windows)):
        k_buf, v_buf = cache.layers[i].keys, cache.layers[i].values  # (B, H, end + T, D)
        for b, f in enumerate(feeds):
            new = slice(ends[i] + pad[b], ends[i] + width)
            f.cache.layers[i].update(k_buf[b : b + 1, :, new], v_buf[b : b + 1, :, new])
    return [logits[b, keep - f.keep :] for b, f in enumerate(feeds)]


def _mask(
    first: list[int],
    end: int,
    pad: list[int],
    width: int,
    window: int | None,
    dev: torch.device,
    dtype: torch.dtype,
    additive: bool,
) -> torch.Tensor:
    """(B, 1, T, end + T): which keys each new token of each row sees (see the module docstring)."""
    first_t = torch.tensor(first, device=dev)[:, None, None]  # (B, 1, 1)
    pad_t = torch.tensor(pad, device=dev)[:, None, None]  # (B, 1, 1)
    key = torch.arange(end + width, device=dev)[None, None, :]  # (1, 1, L) buffer index of a key
    query = end + torch.arange(width, device=dev)[None, :, None]  # (1, T, 1) buffer index of a query
    new_key = key >= end  # a key among the new slots
    real_key = (key >= first_t) & (~new_key | (key >= end + pad_t))  # (B, 1, L): an entry, not padding
    # a row's own cache index: the padding between its context and its new tokens is not counted
    key_index = key - torch.where(new_key, pad_t, torch.zeros_like(pad_t))
    query_index = query - pad_t  # (B, T, 1)
    visible = real_key & (key <= query)
    if window is not None:
        visible &= query_index - key_index < window
    real_query = query >= end + pad_t  # (B, T, 1)
    visible = torch.where(real_query, visible, key == first_t)  # padding queries: their first entry only
    mask = visible[:, None]  # (B, 1, T, L)
    if additive:
        return torch.zeros(mask.shape, dtype=dtype, device=dev).masked_fill(~mask, torch.finfo(dtype).min)
    return mask
