"""The RAM tier: decoded chunk caches kept in memory, least recently used first out, under a byte budget.

A request that finds its chunks here skips the backend read, the hash check and the cast to the compute dtype:
the tensors are held exactly as assembly consumes them (compute dtype, on the model's device). Entries hold
per-layer (k, v) pairs, and only the layers that were asked for (with Gemma 3 a chunk far back in a long
context is needed by the 3 global layers only), so a later request that needs more layers of the same
chunk is a miss that reads them and merges them in.

The budget counts tensor bytes; it is per process (each server holds its own hot set in front of the shared
store). An entry larger than the whole budget is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

LayerPair = tuple[torch.Tensor, torch.Tensor]  # (kv_heads, T, head_dim) each


@dataclass
class TierStats:
    entries: int = 0
    bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class RamTier:
    """key -> {layer: (k, v)}, LRU under `max_bytes`."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"the RAM tier budget must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, dict[int, LayerPair]] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self.stats = TierStats()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, layers: list[int]) -> dict[int, LayerPair] | None:
        """The requested layers if all are held (the entry becomes most recently used), else None."""
        entry = self._entries.get(key)
        if entry is None or any(i not in entry for i in layers):
            self.stats.misses += 1
            return None
        self._entries.move_to_end(key)
        self.stats.hits += 1
        return {i: entry[i] for i in layers}

    def put(self, key: str, layers: dict[int, LayerPair]) -> None:
        """Add (or merge into) an entry, then evict least recently used entries until within budget."""
        if self.max_bytes == 0:
            return
        entry = {**self._entries.pop(key, {}), **layers}
        size = sum(k.nbytes + v.nbytes for k, v in entry.values())
        self.stats.bytes -= self._sizes.pop(key, 0)
        if size > self.max_bytes:  # would evict everything else and still not fit
            self.stats.entries = len(self._entries)
            return
        self._entries[key] = entry
        self._sizes[key] = size
        self.stats.bytes += size
        while self.stats.bytes > self.max_bytes:
            old, _ = self._entries.popitem(last=False)
            self.stats.bytes -= self._sizes.pop(old)
            self.stats.evictions += 1
        self.stats.entries = len(self._entries)

    def discard(self, key: str) -> None:
        """Forget a key (its cache was deleted from the store)."""
        if self._entries.pop(key, None) is not None:
            self.stats.bytes -= self._sizes.pop(key)
            self.stats.entries = len(self._entries)
