"""The chunk caches a request reads, nearest tier first: decoded layers in RAM, then the store.

The engine asks once per request for the layers it needs of each chunk (`read`) and gets them ready to
assemble: on the model's device, in the compute dtype. What the RAM tier holds costs no read, no hash check
and no cast; the rest is read from the store (files, Redis: one round trip) and kept in the RAM tier on the
way. With no RAM tier, a store in the compute dtype is read in place instead (`read`). A chunk computed
during a request goes to the store and into the RAM tier too (`hold`: write-through), so every tier returns
the same numbers: what the store's format gives back.

The RAM tier is per process (each server holds its own hot set in front of a shared store); the store is
what outlives the process.
"""

from __future__ import annotations

import torch

from turborag.store.chunk_kv import ChunkKV
from turborag.store.kv_store import KVStore, Layers, StoredChunk
from turborag.store.ram_tier import RamTier


class TieredStore:
    """A RAM tier of `ram_bytes` in front of `store`, reads ready on `device` in `dtype`."""

    def __init__(self, store: KVStore, ram_bytes: int = 0, device: str | torch.device = "cpu", dtype=None):
        self.store = store
        self.ram = RamTier(ram_bytes)
        self.device = torch.device(device)
        self.dtype = dtype if dtype is not None else torch.float32

    @property
    def in_place(self) -> bool:
        """Whether reads leave the tensors in the store for assembly to read in place (`read`)."""
        store = self.store
        return (
            not self.ram.max_bytes
            and self.device.type == "cpu"
            and not store.quantized
            and store.torch_dtype == self.dtype
        )

    def read(self, wanted: dict[str, list[int]], n_layers: int) -> dict[str, Layers | StoredChunk | None]:
        """Per chunk key, (k, v) for the layers wanted and None for the others (a list of `n_layers`), or
        None for a chunk no tier holds (the caller computes it).

        With no RAM tier, on the CPU, from a store that keeps caches in the compute dtype (bf16 serving),
        nothing needs a copy of its own: a chunk comes back open (a StoredChunk), and assembly reads each
        tensor straight into its place in the serving buffers, one copy instead of a read and then a copy.
        With assembly's layer groups, that shortened turbo's distance from the floor at 8k context tokens
        by about a fifth (turborag_research/notes/2026-12-06-ttft-floor.md)."""
        out: dict[str, Layers | StoredChunk | None] = {}
        for key, layers in wanted.items():
            held = self.ram.get(key, layers)
            if held is not None:
                out[key] = [held.get(i) for i in range(n_layers)]
        if self.in_place:
            out.update(self.store.open_many({k: v for k, v in wanted.items() if k not in out}))
            return out
        read = self.store.get_many_layers({k: v for k, v in wanted.items() if k not in out})
        for key, layers in read.items():
            if layers is not None and self.ram.max_bytes:
                ready = {i: (p[0].to(self.device, self.dtype), p[1].to(self.device, self.dtype))
                         for i, p in enumerate(layers) if p}  # fmt: skip
                self.ram.put(key, ready)
                layers = [ready.get(i) for i in range(n_layers)]
            out[key] = layers
        return out

    def hold(self, key: str, chunk: ChunkKV, keep: bool = False) -> ChunkKV | None:
        """Write-through for a chunk just computed (and put in the store): kept in the RAM tier as a read
        would return it. With `keep`, also returned in that form (the store's format, on chunk's device), so
        the request that computed it uses the numbers every later request reads."""
        if not (keep or self.ram.max_bytes):
            return None
        stored = self.store.as_stored(chunk)
        if self.ram.max_bytes:
            ready = stored.to(self.device, self.dtype)  # (L, H, T, D) each
            self.ram.put(key, {i: (ready.k[i], ready.v[i]) for i in range(ready.k.shape[0])})
        return stored

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters of both tiers, for metrics: the store's reads and the RAM tier's entries, bytes, hits,
        misses and evictions."""
        store = {"hits": self.store.hits, "misses": self.store.misses, "unavailable": self.store.unavailable}
        return {"store": store, "ram": vars(self.ram.stats).copy()}
