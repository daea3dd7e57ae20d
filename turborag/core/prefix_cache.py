"""Prompt (prefix) caching for requests without retrieval, as OpenAI and Bedrock do for agent workflows.

An agent sends the same long system prompt and tool definitions at every step. Their K/V is kept in RAM
in blocks of `block_size` tokens, each keyed by a chained hash (hash of the previous block's key + this
block's token ids), so a key names a whole prefix, not just one block. A new request walks its blocks
and reuses the longest run of hits; only the rest is prefilled. Blocks sit at their absolute positions
(a prompt prefix always starts at position 0), so no RoPE rotation is needed.

Bounded by `max_tokens` in total, least recently used blocks evicted first.

Partitions: a server shared by several API keys must not let one key's `cached_tokens` (or its faster
answer) tell it that another key sent the same prefix. A partition name (the key's) salts the block hashes,
so blocks of one partition never match another's prompts; the same prefix sent by two keys is stored twice.
`match` and `insert` take it as an argument (Engine.begin_prompt passes the request's).

Worked example (block_size 4): step 1 prompt = S S S S S S S S Q1 (8 system tokens + question) stores
blocks b0 = h(S S S S), b1 = h(b0, S S S S). Step 2 prompt = S S S S S S S S A1 Q2 hits b0, b1: 8 tokens
reused, only "A1 Q2" prefilled.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch

from turborag.core.kv import _stack
from turborag.store.chunk_kv import ChunkKV


def block_keys(ids: Sequence[int], block_size: int, salt: str = "") -> list[str]:
    """Chained hash of every full block of `ids`."""
    keys, prev = [], salt
    for start in range(0, len(ids) - block_size + 1, block_size):
        h = hashlib.sha256(prev.encode())
        h.update(str(list(ids[start : start + block_size])).encode())
        prev = h.hexdigest()
        keys.append(prev)
    return keys


class PrefixCache:
    """LRU map chained-block-hash -> block K/V, thread-safe."""

    def __init__(self, block_size: int = 64, max_tokens: int = 65536, salt: str = ""):
        if block_size < 1 or max_tokens < block_size:
            raise ValueError("need block_size >= 1 and max_tokens >= block_size")
        self.block_size = block_size
        self.max_blocks = max_tokens // block_size
        self.salt = salt  # the model fingerprint: blocks of one model never serve another
        self._blocks: OrderedDict[str, ChunkKV] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0  # tokens served from the cache
        self.lookups = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()

    def _salt(self, partition: str) -> str:
        """The block hashes' salt: the model's fingerprint, and the partition if any."""
        return f"{self.salt}\x00{partition}" if partition else self.salt

    def match(self, ids: Sequence[int], partition: str = "") -> tuple[int, ChunkKV | None]:
        """Longest cached prefix of `ids` in whole blocks of `partition`: (tokens, K/V (L, H, tokens, D)) or
        (0, None)."""
        parts = []
        with self._lock:
            self.lookups += 1
            for key in block_keys(ids, self.block_size, self._salt(partition)):
                block = self._blocks.get(key)
                if block is None:
                    break
                self._blocks.move_to_end(key)
                parts.append(block)
        if not parts:
            return 0, None
        n = len(parts) * self.block_size
        self.hits += n
        return n, ChunkKV(torch.cat([p.k for p in parts], dim=2), torch.cat([p.v for p in parts], dim=2))

    def insert(
        self,
        ids: Sequence[int],
        layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
        partition: str = "",
    ) -> int:
        """Store every full block of `ids` not cached yet in `partition`, slicing it from the model cache's
        per-layer (k, v), each (1, H, >= len(ids), D). Only new blocks are copied. Returns their number."""
        new = 0
        with self._lock:
            for i, key in enumerate(block_keys(ids, self.block_size, self._salt(partition))):
                if key in self._blocks:
                    self._blocks.move_to_end(key)
                    continue
                s, e = i * self.block_size, (i + 1) * self.block_size
                self._blocks[key] = _stack(layers, s, e)  # (L, H, block, D), a copy
                new += 1
            while len(self._blocks) > self.max_blocks:
                self._blocks.popitem(last=False)
        return new
