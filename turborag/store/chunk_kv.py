"""`ChunkKV`: the K/V tensors of a span of tokens for every layer, the unit that is stored and assembled.

It lives in the store layer because both the store (which writes and reads it) and the core (which computes,
rotates and assembles it) need it, and the store must not import the core.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ChunkKV:
    """K/V of a token span for every layer."""

    k: torch.Tensor  # (layers, kv_heads, T, head_dim), post-RoPE keys
    v: torch.Tensor  # (layers, kv_heads, T, head_dim)

    @property
    def tokens(self) -> int:
        return self.k.shape[2]

    def to(self, device: torch.device | str, dtype: torch.dtype) -> ChunkKV:
        return ChunkKV(self.k.to(device=device, dtype=dtype), self.v.to(device=device, dtype=dtype))
