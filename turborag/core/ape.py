"""APE (Yang et al., "Adaptive Parallel Encoding", ICLR 2025, arXiv 2502.05431): a training-free fix of how
tokens after an assembled turbo context attend to it.

Chunks encoded in parallel (each behind the shared prefix, never seeing each other) leave the tokens that
come after them attending too broadly and too much to the context: each chunk brings its own copy of the
attention mass a single document would have had. APE keeps the shared prefix (we always have it) and, for
every token after the context (the question, the abstention reply, every decoded token), changes that
token's softmax over the context keys C only:

- a temperature T: the logits over C are divided by T (T < 1 sharpens the distribution within C);
- a scaling factor S: C's total share is set from its log-sum-exp, LSE_C = log sum_{j in C} exp(x_j / T),
  as exp(S * T * LSE_C) beside the other keys' (prefix, question) exp(x_o).

So, with x the scaled (and soft-capped) logits of one query row:

    p_j = exp(x_j / T + (S*T - 1) * LSE_C) / Z   for j in C
    p_o = exp(x_o) / Z                           for the other visible keys
    Z   = exp(S*T*LSE_C) + sum_o exp(x_o)

which is the paper's combination of the two partial attentions by their LSEs (its code does it with two
flash-attention calls); here it is one softmax over adjusted logits. T = S = 1 is plain attention exactly.
Defaults T = S = 0.9 are the paper's (its README: "preserving over 90% performance on few-shot tasks").

Mechanics: `ATTENTION` is registered in transformers' attention interface (and its mask interface, with
sdpa's boolean masks), the model switches to it only inside `enabled(model)`, and which keys are context
comes with the forward as the keyword `ape` (an `ApeContext`), which transformers hands through every
decoder layer to the attention function. The model code is never forked.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from turborag.core.options import TrainingFree

ATTENTION = "turborag_ape"
DEFAULT_TEMPERATURE = TrainingFree.ape_temperature
DEFAULT_SCALE = TrainingFree.ape_scale


@dataclass(frozen=True)
class ApeContext:
    """Which keys of each layer are context, and APE's two settings, for one forward.

    `lo[i]` and `hi[i]` are (B,) tensors: in layer i, row b's context keys are the key indices
    lo[i][b] <= j < hi[i][b] (a sliding layer may hold only the tail of the context, and a batch row sits
    behind left padding, so the span differs per layer and per row)."""

    lo: list[torch.Tensor]  # per layer (B,) first context key index
    hi: list[torch.Tensor]  # per layer (B,) one past the last
    temperature: float = DEFAULT_TEMPERATURE
    scale: float = DEFAULT_SCALE


def context_span(offsets: list[int], start: int, end: int, device=None) -> tuple[list, list]:
    """(lo, hi) per layer for one sequence whose context occupies cache indices [start, end), where layer i
    holds the cache from index offsets[i] on (0 for a layer that holds everything)."""
    lo = [torch.tensor([max(start - o, 0)], device=device) for o in offsets]
    hi = [torch.tensor([max(end - o, 0)], device=device) for o in offsets]
    return lo, hi


def adjusted_probs(
    logits: torch.Tensor,  # (B, H, T, K) scaled attention logits, fp32
    visible: torch.Tensor,  # (B, 1 or H, T, K) bool: keys each query may see
    context: torch.Tensor,  # (B, 1, 1, K) bool: context keys
    temperature: float,
    scale: float,
) -> torch.Tensor:
    """The APE attention weights (B, H, T, K); rows without visible context keys get plain softmax."""
    neg = torch.finfo(logits.dtype).min
    in_c = visible & context  # (B, H|1, T, K)
    x_c = torch.where(in_c, logits / temperature, neg)
    lse_c = torch.logsumexp(x_c, dim=-1, keepdim=True)  # (B, H, T, 1)
    has_c = in_c.any(dim=-1, keepdim=True)
    lift = torch.where(has_c, (scale * temperature - 1.0) * lse_c, 0.0)  # log of C's rescaling
    adjusted = torch.where(context, logits / temperature + lift, logits)
    adjusted = torch.where(visible, adjusted, float("-inf"))
    return torch.softmax(adjusted, dim=-1)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, Hkv, K, D) -> (B, Hkv * groups, K, D): each key/value head serves `groups` query heads."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def ape_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, H, T, D)
    key: torch.Tensor,  # (B, Hkv, K, D)
    value: torch.Tensor,  # (B, Hkv, K, Dv)
    attention_mask: torch.Tensor | None,  # (B, 1, T, K) bool (True = visible) or additive; None = causal
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    ape: ApeContext | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns (B, T, H, Dv) and no weights."""
    if ape is None:
        raise ValueError("turborag_ape attention needs the `ape` keyword (an ApeContext)")
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    logits = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scaling  # (B, H, T, K)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    t, k = logits.shape[-2:]
    j = torch.arange(k, device=logits.device)
    if attention_mask is None:  # causal, the queries being the last T keys
        visible = (j[None, :] <= (k - t) + torch.arange(t, device=logits.device)[:, None])[None, None]
    elif attention_mask.dtype == torch.bool:
        visible = attention_mask[..., -k:]
    else:  # an additive mask (eager): fold it into the logits, keep what it does not forbid
        logits = logits + attention_mask[..., -k:].float()
        visible = attention_mask[..., -k:] > torch.finfo(attention_mask.dtype).min / 2
    layer = module.layer_idx
    lo, hi = ape.lo[layer].to(logits.device), ape.hi[layer].to(logits.device)
    context = ((j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None]))[:, None, None, :]  # (B, 1, 1, K)
    probs = adjusted_probs(logits, visible, context, ape.temperature, ape.scale)
    out = torch.matmul(probs.to(value.dtype), value)  # (B, H, T, Dv)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, ape_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


@contextlib.contextmanager
def enabled(model: torch.nn.Module):
    """Inside this block the model's attention is `ape_attention` (every forward must then pass `ape=`)."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    saved = {key: cfg._attn_implementation for key, cfg in configs.items()}
    try:
        for cfg in configs.values():
            cfg._attn_implementation = ATTENTION
        yield
    finally:
        for key, cfg in configs.items():
            cfg._attn_implementation = saved[key]
