"""Decode many requests in one forward: the batched step of the server's continuous batching.

Decoding a small model is memory-bound: a forward of 8 tokens (one per request) costs little more than a
forward of one, because the weights are read once either way. So the server keeps every running request in
one `DecodeBatch` and feeds all their next tokens in a single forward.

Requests differ in everything a cache has: context length, RoPE positions (turbo re-positions chunks; two
requests' next positions are unrelated), how much of the context a sliding-window layer still holds. The
batch keeps, per layer, one buffer (B, H, capacity, D) in which each row's entries are right-aligned to a
common end, so that every row's next token is written at the same index:

    row 0:  . . . . k k k k k k | new      (left padding, masked)
    row 1:  k k k k k k k k k k | new
    row 2:  . . . . . . . k k k | new

A row's entries are its cache in cache order, so the distance between two of its entries is the same in
the buffer as in the row's own cache, and the sliding window (a key is visible to a query less than W
cache indices behind it) is one comparison in buffer indices. The mask, per row: keys from the row's first
entry to the new one, and within W of the new one on sliding layers; position ids are per row. Padding is
zeros, never uninitialised memory: a masked entry gets weight exactly 0, and 0 times garbage could be NaN.

The buffers are rebuilt ("packed") only when rows join or leave: rows that left are dropped, the left
padding is trimmed to the longest row, and each buffer gets room for the most tokens any row may still
feed. Between packs a step is one slice write per layer, as for a single request (hf_compat.BufferedLayer).
A sliding layer holds at most W - 1 context entries per row (what the next query can see) plus the decode
room, exactly like the single-request cache.

Rows answering in turbo-ape (core/ape.py) bring the span of their context entries per layer; the batch
keeps it relative to the row's first entry (less what a pack trims off the front) and, while any such row
runs, steps with APE's attention, the other rows with an empty span, which is plain attention.
"""

from __future__ import annotations

import contextlib

import torch

from turborag.core import ape, decode_weights, hf_compat, query_adapter
from turborag.core.generate import DecodeState

MaskArg = torch.Tensor | dict[str, torch.Tensor]


class DecodeBatch:
    """The running sequences of a server, decoded one token each per `step`."""

    def __init__(self, model: torch.nn.Module, windows: list[int | None]):
        self.model = model
        self.windows = windows  # per layer: the sliding window, or None for a global layer
        self.rows: list[DecodeState] = []
        self.k: list[torch.Tensor] = []  # per layer (B, H, capacity, D)
        self.v: list[torch.Tensor] = []
        self.first: list[torch.Tensor] = []  # per layer (B,) buffer index of each row's first entry
        self.end: list[int] = []  # per layer: entries written (the next token goes at this index)
        # per row: None, or (lo, hi) per layer, its APE context entries relative to its first entry
        self.spans: list[tuple[list[int], list[int]] | None] = []
        self.cache = None
        self.packs = 0  # how many times the buffers were rebuilt (tests, metrics)
        eager = getattr(model.config, "_attn_implementation", "sdpa") == "eager"
        self._additive = eager  # eager attention adds the mask; sdpa takes a boolean one

    def __len__(self) -> int:
        return len(self.rows)

    @torch.inference_mode()
    def step(self, rows: list[DecodeState]) -> None:
        """Feed each row's picked `token` at its own `pos` in one forward, and hand each its logits."""
        if [id(r) for r in rows] != [id(r) for r in self.rows]:
            self._pack(rows)
        dev = self.k[0].device
        ids = torch.tensor([[r.token] for r in rows], device=dev)  # (B, 1)
        pos = torch.tensor([[r.pos] for r in rows], device=dev)  # (B, 1)
        mask = self._mask()
        attention = self._ape_context()
        ape_on = ape.enabled(self.model) if attention is not None else contextlib.nullcontext()
        with ape_on, query_adapter.active(self.model, [r.adapter for r in rows]), decode_weights.decoding():
            extra = {"ape": attention} if attention is not None else {}
            logits = hf_compat.forward(
                self.model, ids, pos, self.cache, attention_mask=mask, logits_to_keep=1, **extra
            )
        self.end = [e + 1 for e in self.end]
        for r, row_logits in zip(rows, logits[:, -1]):  # (B, vocab)
            r.fed(row_logits)

    def clear(self) -> None:
        """Drop every row and the buffers (the server is idle)."""
        self.rows, self.k, self.v, self.first, self.end, self.cache = [], [], [], [], [], None
        self.spans = []

    # -- packing -------------------------------------------------------------------------------------

    def _entries(self, row: DecodeState, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Row's entries of layer i, (H, n, D) each: from the batch if it is a member, else its own cache;
        a sliding layer keeps only the last W - 1 (older ones can no longer be seen). Also how many entries
        were dropped from the front."""
        if row.cache is not None:
            layer = row.cache.layers[i]
            k, v = layer.keys[0], layer.values[0]  # (H, n, D)
        else:
            b = self._index[id(row)]
            first = int(self.first[i][b])
            k, v = self.k[i][b, :, first : self.end[i]], self.v[i][b, :, first : self.end[i]]
        w = self.windows[i]
        if w is not None and k.shape[1] > w - 1:
            dropped = k.shape[1] - (w - 1)
            return k[:, dropped:], v[:, dropped:], dropped
        return k, v, 0

    def _pack(self, rows: list[DecodeState]) -> None:
        """Rebuild the buffers for exactly `rows`, in that order (members keep their entries, new rows bring
        their own caches, which are then dropped)."""
        self._index = {id(r): b for b, r in enumerate(self.rows)}
        spans = [self._span(r) for r in rows]
        room = max(r.remaining for r in rows) + 1  # tokens any row may still feed, plus one spare
        k_new, v_new, first_new, end_new = [], [], [], []
        for i in range(len(self.windows)):
            parts = [self._entries(r, i) for r in rows]
            for span, (_, _, dropped) in zip(spans, parts):
                if span is not None:
                    span[0][i], span[1][i] = max(span[0][i] - dropped, 0), max(span[1][i] - dropped, 0)
            end = max(k.shape[1] for k, _, _ in parts)
            h, d_k, d_v = parts[0][0].shape[0], parts[0][0].shape[2], parts[0][1].shape[2]
            like = parts[0][0]
            k_buf = torch.zeros(len(rows), h, end + room, d_k, dtype=like.dtype, device=like.device)
            v_buf = torch.zeros(len(rows), h, end + room, d_v, dtype=like.dtype, device=like.device)
            first = torch.empty(len(rows), dtype=torch.long, device=like.device)
            for b, (k, v, _) in enumerate(parts):
                n = k.shape[1]
                k_buf[b, :, end - n : end] = k
                v_buf[b, :, end - n : end] = v
                first[b] = end - n
            k_new.append(k_buf)
            v_new.append(v_buf)
            first_new.append(first)
            end_new.append(end)
        for r in rows:
            r.cache = None  # its entries live in the batch now
        self.rows, self.k, self.v, self.first, self.end = list(rows), k_new, v_new, first_new, end_new
        self.spans = spans
        self.cache = hf_compat.buffered_cache_of(
            [(k, v, e, 0, False) for k, v, e in zip(self.k, self.v, self.end)], reserve=room
        )
        self.packs += 1

    def _span(self, row: DecodeState) -> tuple[list[int], list[int]] | None:
        """A copy of the row's APE span per layer, relative to its first entry (None: not an APE row)."""
        if row.cache is None:  # a member: as kept
            span = self.spans[self._index[id(row)]]
            return None if span is None else (list(span[0]), list(span[1]))
        if row.attention is None:
            return None
        return [int(t[0]) for t in row.attention.lo], [int(t[0]) for t in row.attention.hi]

    def _ape_context(self) -> ape.ApeContext | None:
        """This step's APE context in buffer indices, or None when no row answers in turbo-ape."""
        settings = {(r.attention.temperature, r.attention.scale) for r in self.rows if r.attention}
        if not settings:
            return None
        assert len(settings) == 1, "rows of one batch share the engine's APE settings"
        empty = ([0] * len(self.windows), [0] * len(self.windows))
        spans = [s if s is not None else empty for s in self.spans]
        lo = [self.first[i] + torch.tensor([s[0][i] for s in spans]) for i in range(len(self.windows))]
        hi = [self.first[i] + torch.tensor([s[1][i] for s in spans]) for i in range(len(self.windows))]
        temperature, scale = settings.pop()
        return ape.ApeContext(lo, hi, temperature, scale)

    # -- masks ---------------------------------------------------------------------------------------

    def _mask(self) -> MaskArg:
        """The attention mask of this step: one (B, 1, 1, end + 1) tensor when every layer is alike, else one
        per layer kind ("full_attention", "sliding_attention"), the form Gemma 3 and Qwen 2 take."""
        kinds: dict[int | None, torch.Tensor] = {}
        for i, w in enumerate(self.windows):
            if w not in kinds:
                kinds[w] = self._kind_mask(i, w)
        if len(kinds) == 1:
            return next(iter(kinds.values()))
        return {("sliding_attention" if w is not None else "full_attention"): m for w, m in kinds.items()}

    def _kind_mask(self, i: int, window: int | None) -> torch.Tensor:
        """Keys a new token may see in layer i: from the row's first entry on, and within the window."""
        q = self.end[i]  # buffer index of the token being fed
        idx = torch.arange(q + 1, device=self.first[i].device)  # (L,)
        visible = idx[None, :] >= self.first[i][:, None]  # (B, L)
        if window is not None:
            visible &= idx[None, :] > q - window
        mask = visible[:, None, None, :]  # (B, 1, 1, L)
        if self._additive:
            dtype = self.k[i].dtype
            return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(dtype).min
            )
        return mask
