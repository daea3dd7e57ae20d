"""The one place that touches the transformers cache API.

transformers moved this API three times in the 5.x line: 5.0 dropped `DynamicCache.from_legacy_cache`, 5.4
removed `cache_position`, 5.24 renamed the forward keyword `past_key_values` to `cache`. Everything else in
turborag speaks plain tensors, `(kv_heads, T, head_dim)` per layer, and calls the model only through
`forward` below.

We always build a `DynamicCache` *without* a config, so every layer keeps all of its keys, sliding-window
layers included. The sliding window is still enforced by the attention mask (transformers builds it from
`config.sliding_window` and token indices), so results are exact; we simply keep the keys that a
precomputed chunk needs whatever its final place in the context.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
from transformers import DynamicCache

KV = tuple[torch.Tensor, torch.Tensor]  # (keys, values), each (batch, kv_heads, T, head_dim)


def new_cache(layers: list[KV] | None = None) -> DynamicCache:
    """A cache holding `layers[i] = (k, v)` for every layer i (or an empty one)."""
    cache = DynamicCache()
    for i, (k, v) in enumerate(layers or []):
        cache.update(k, v, i)
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
) -> torch.Tensor:
    """Run the causal LM on `input_ids` at explicit positions, appending their K/V to `cache`.

    Returns logits (B, T, vocab), or only the last `logits_to_keep` positions when it is > 0 (saves the
    vocab projection of every prompt token, which matters for a 262k-token vocabulary like Gemma's).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps the model
    kwargs = {_cache_kwarg(type(base)): cache}
    out = model(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        use_cache=True,
        logits_to_keep=logits_to_keep,
        **kwargs,
    )
    return out.logits


def move_tail(cache: DynamicCache, indices: torch.Tensor, n: int) -> None:
    """Overwrite entries `indices` of every layer with the entries appended after index n, then drop them.

    Used after recomputing some tokens: their fresh K/V were appended by the forward and replace the stale.
    """
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)  # (B, H, n + S, D)
            t[:, :, indices] = t[:, :, n:]
            setattr(layer, name, t[:, :, :n])


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
