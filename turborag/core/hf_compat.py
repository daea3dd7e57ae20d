"""The one place that touches the transformers cache API.

transformers moved this API three times in the 5.x line: 5.0 dropped `DynamicCache.from_legacy_cache`, 5.4
removed `cache_position`, 5.24 renamed the forward keyword `past_key_values` to `cache`. Everything else in
turborag speaks plain tensors, `(kv_heads, T, head_dim)` per layer, and calls the model only through
`forward` below.

We always build a `DynamicCache` *without* a config, so precompute and training keep every key of every
layer (a precomputed chunk needs all its keys, whatever its final place in the context). The sliding window
is enforced by the attention mask, which transformers builds from `config.sliding_window` and cache
indices. At serving time `BufferedSlidingLayer` holds only the tail of the context that a sliding layer can
still see, and reports the dropped entries as an offset (`get_mask_sizes`, `get_seq_length`), exactly as
transformers' own `DynamicSlidingWindowLayer` does, so the mask, and the result, are unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV = tuple[torch.Tensor, torch.Tensor]  # (keys, values), each (batch, kv_heads, T, head_dim)


class BufferedLayer(DynamicLayer):
    """A DynamicLayer that writes new K/V into preallocated room instead of concatenating.

    DynamicLayer copies the whole layer on every update (torch.cat): for an 8k-token cache that is
    ~300 MB of copies per decoded token. Here an update is one slice write; the buffer grows (with
    `reserve` spare tokens) only when full. Serving only: training keeps plain DynamicLayer, whose
    concatenation autograd handles without in-place writes.
    """

    def __init__(self, reserve: int = 64):
        super().__init__()
        self.reserve = reserve
        self.length = 0
        self.k_buf: torch.Tensor | None = None  # (B, H, capacity, D)
        self.v_buf: torch.Tensor | None = None

    @classmethod
    def wrap(
        cls, k_buf: torch.Tensor, v_buf: torch.Tensor, length: int, reserve: int, **kwargs
    ) -> BufferedLayer:
        """A layer over already-filled buffers whose first `length` tokens are valid."""
        layer = cls(reserve, **kwargs)
        layer.lazy_initialization(k_buf, v_buf)
        layer.k_buf, layer.v_buf, layer.length = k_buf, v_buf, length
        layer._views()
        return layer

    def _views(self) -> None:
        self.keys = self.k_buf[:, :, : self.length]
        self.values = self.v_buf[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> KV:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[-2]
        if self.k_buf is None or self.length + t > self.k_buf.shape[-2]:
            b, h, _, d = key_states.shape
            cap = self.length + t + self.reserve
            k_new = key_states.new_empty(b, h, cap, d)
            v_new = value_states.new_empty(b, h, cap, value_states.shape[-1])
            if self.length:
                k_new[:, :, : self.length] = self.keys
                v_new[:, :, : self.length] = self.values
            self.k_buf, self.v_buf = k_new, v_new
        self.k_buf[:, :, self.length : self.length + t] = key_states
        self.v_buf[:, :, self.length : self.length + t] = value_states
        self.length += t
        self._views()
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        self.length = max(0, self.length - abs(tokens_to_remove))
        self._views()


class BufferedSlidingLayer(BufferedLayer):
    """A BufferedLayer for a sliding-window layer that holds only the context from cache index `offset` on.

    transformers builds the sliding mask of every sliding layer from the first one's `get_mask_sizes`:
    (kv_length, kv_offset) = (entries held + query length, entries dropped). The query's own index is
    `get_seq_length()`, which counts the dropped entries too. Entries that fall out of the window during
    decoding stay in the buffer, masked, so nothing is copied; the buffer holds at most W - 1 context
    entries plus the `reserve` for the question and the answer.
    """

    is_sliding = True

    def __init__(self, reserve: int = 64, offset: int = 0):
        super().__init__(reserve)
        self.offset = offset

    def get_seq_length(self) -> int:
        return self.offset + self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, self.offset


def new_cache(layers: list[KV] | None = None) -> DynamicCache:
    """A cache holding `layers[i] = (k, v)` for every layer i (or an empty one), plain DynamicLayers."""
    cache = DynamicCache()
    for i, (k, v) in enumerate(layers or []):
        cache.update(k, v, i)
    return cache


def buffered_cache(n_layers: int, reserve: int = 64) -> DynamicCache:
    """An empty serving cache of BufferedLayers (full prefill, plain prompts)."""
    cache = DynamicCache()
    cache.layers = [BufferedLayer(reserve) for _ in range(n_layers)]
    return cache


def buffered_cache_of(
    layers: list[tuple[torch.Tensor, torch.Tensor, int, int, bool]], reserve: int = 64
) -> DynamicCache:
    """A serving cache over filled buffers: per layer (k_buf, v_buf, length, offset, sliding), buffers
    (B, H, capacity, D) whose first `length` entries are cache indices offset .. offset + length - 1."""
    cache = DynamicCache()
    for k_buf, v_buf, length, offset, sliding in layers:
        if sliding:
            layer = BufferedSlidingLayer.wrap(k_buf, v_buf, length, reserve, offset=offset)
        else:
            assert offset == 0, "only sliding layers may drop context entries"
            layer = BufferedLayer.wrap(k_buf, v_buf, length, reserve)
        cache.layers.append(layer)
    return cache


def cache_layers(cache: DynamicCache) -> list[KV]:
    """The cache's tensors, one (k, v) per layer, each (batch, kv_heads, T, head_dim)."""
    return [(layer.keys, layer.values) for layer in cache.layers]


@functools.cache
def _cache_kwarg(model_cls: type) -> str:
    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def forward(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # (B, T)
    position_ids: torch.Tensor,  # (B, T) or (1, T)
    cache: DynamicCache,
    *,
    attention_mask: torch.Tensor
    | None = None,  # None = causal; or a 4D additive/bool mask (B, 1, T, past + T)
    logits_to_keep: int = 0,
    **attention_kwargs,
) -> torch.Tensor:
    """Run the causal LM on `input_ids` at explicit positions, appending their K/V to `cache`.

    Returns logits (B, T, vocab), or only the last `logits_to_keep` positions when it is > 0 (saves the
    vocab projection of every prompt token, which matters for a 262k-token vocabulary like Gemma's).
    `attention_kwargs` reach the attention function of every layer (core/ape.py passes `ape=`).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps the model
    kwargs = {_cache_kwarg(type(base)): cache}
    if logits_to_keep > 0:
        # As indices, not a count: the model then gathers the kept rows into a contiguous tensor. A count
        # makes a strided slice, and torch's matmul does not fold a strided 3-D input into one mm when the
        # weights do not require grad: it copies the whole (vocab, hidden) head instead (1.3 s per forward
        # for Gemma's 262k-token vocabulary, measured).
        t = input_ids.shape[1]
        logits_to_keep = torch.arange(max(0, t - logits_to_keep), t, device=input_ids.device)
    out = model(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        use_cache=True,
        logits_to_keep=logits_to_keep,
        **kwargs,
        **attention_kwargs,
    )
    return out.logits


def move_tail(cache: DynamicCache, indices: torch.Tensor, n: int) -> None:
    """Overwrite entries `indices` of every layer with the entries appended after index n, then drop them.

    Used after recomputing some tokens: their fresh K/V were appended by the forward and replace the stale.
    """
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)  # (B, H, n + S, D)
            t[:, :, indices] = t[:, :, n:].clone()  # same storage: copy first (no overlapping write)
            setattr(layer, name, t[:, :, :n])
        if isinstance(layer, BufferedLayer):
            layer.length = n
            layer._views()


@contextlib.contextmanager
def first_layers(model: torch.nn.Module, k: int):
    """Run only the first k decoder layers inside this block (HF decoders loop over
    `layers[: config.num_hidden_layers]`): a cheap partial prefill for measuring early-layer K/V."""
    cfg = model.config
    saved = cfg.num_hidden_layers
    cfg.num_hidden_layers = min(k, saved)
    try:
        yield
    finally:
        cfg.num_hidden_layers = saved
