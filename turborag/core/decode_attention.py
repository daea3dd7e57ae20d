"""Attention of one query row per sequence (a decode step) on a CPU, with grouped K/V heads packed.

A decode step asks attention for one query per sequence over its whole cache. Given no mask, transformers
hands PyTorch's `scaled_dot_product_attention` the query as (B, H, 1, D) with `enable_gqa`, which on a CPU
takes 0.75 ms over 450 keys and 2.1 ms over 1,500 (12 query heads over 2 K/V heads, bf16, 2 cores). The
same product with the query packed as (B, H_kv, H / H_kv, D), each K/V head's query heads as rows of one
matrix, takes 0.09 ms: in a 28-layer model the unpacked call was a sixth of a decode step at 450 context
tokens, and more at longer contexts. `NAME` is registered in transformers' attention interface: the packed
call for a single query row on a CPU, transformers' own SDPA function for everything else. So every prefill
(the chunk caches, the question, the first token) is exactly what it was; only decode steps take the packed
call. `use(model)` switches a loaded model to it (not part of its config as saved or fingerprinted).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "turborag_sdpa"


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, H, T, D)
    key: torch.Tensor,  # (B, Hkv, K, D)
    value: torch.Tensor,  # (B, Hkv, K, Dv)
    attention_mask: torch.Tensor | None,  # (B, 1, T, K) bool (True = visible) or additive; None = all
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns (B, T, H, Dv) and no weights."""
    single = query.shape[2] == 1 and query.device.type == "cpu" and not module.training
    plain = all(kwargs.get(k) is None for k in ("softcap", "position_bias")) and not kwargs.get(
        "output_attentions"
    )
    if not (single and plain) or (attention_mask is not None and attention_mask.shape[1] != 1):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    b, h, _, d = query.shape
    kv_heads = key.shape[1]
    q = query.reshape(b, kv_heads, h // kv_heads, d)  # (B, Hkv, G, D): query head i reads key head i // G
    mask = None if attention_mask is None else attention_mask[:, :, -1:, :]  # (B, 1, 1, K)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, 1, h, out.shape[-1]), None  # (B, Hkv, G, Dv) -> (B, 1, H, Dv)


AttentionInterface.register(NAME, attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def use(model: torch.nn.Module) -> None:
    """Switch a model that attends with SDPA to `attention` (every config of its modules: a multimodal model
    has several)."""
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", None) == "sdpa":
            cfg._attn_implementation = NAME
