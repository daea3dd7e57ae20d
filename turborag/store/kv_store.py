"""Content-addressed store of chunk K/V caches: safetensors files on disk, never pickle.

Key = sha256(format version, model fingerprint, store dtype, prefix token ids, chunk token ids). Any change
to the model, the instruction prefix or the chunk text gives a new key, so a stale cache can never be
served; old files are garbage once nothing references them.

Each file holds tensors `k` and `v`, (layers, kv_heads, T, head_dim), and a CRC32 of the tensor bytes in
the safetensors metadata. Writes go to a temp file that is renamed into place (atomic on POSIX), so a
crash leaves either the old state or the new file, never half a file. Reads verify the CRC: a damaged
file is logged and reported as missing (the caller recomputes it), never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zlib
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from turborag.store.chunk_kv import ChunkKV

log = logging.getLogger(__name__)

FORMAT_VERSION = "1"
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def cache_key(fingerprint: str, prefix_ids: list[int], chunk_ids: list[int], dtype: str = "float16") -> str:
    h = hashlib.sha256()
    h.update(json.dumps([FORMAT_VERSION, fingerprint, dtype, prefix_ids, chunk_ids]).encode())
    return h.hexdigest()


def _data_crc(blob: bytes) -> tuple[int, int]:
    """(CRC32 of the tensor data section, header length) of a safetensors blob."""
    header_len = int.from_bytes(blob[:8], "little")
    return zlib.crc32(memoryview(blob)[8 + header_len :]), header_len


class KVStore:
    """Chunk caches under `root/kv/ab/<key>.safetensors`."""

    def __init__(self, root: str | Path, dtype: str = "float16"):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown store dtype {dtype!r}: use one of {sorted(_DTYPES)}")
        self.root = Path(root)
        self.dtype = dtype
        self.torch_dtype = _DTYPES[dtype]
        self.hits = 0
        self.misses = 0

    def path(self, key: str) -> Path:
        return self.root / "kv" / key[:2] / f"{key}.safetensors"

    def __contains__(self, key: str) -> bool:
        return self.path(key).exists()

    def put(self, key: str, kv: ChunkKV) -> int:
        """Write atomically; returns bytes written."""
        tensors = {
            "k": kv.k.detach().to("cpu", self.torch_dtype).contiguous(),
            "v": kv.v.detach().to("cpu", self.torch_dtype).contiguous(),
        }
        # CRC over the data section: serialise once without it to learn the bytes, then again with it. The
        # data section does not depend on the metadata, so the CRC stays valid.
        crc, _ = _data_crc(st_save(tensors))
        blob = st_save(
            tensors, metadata={"format": "turborag-kv", "version": FORMAT_VERSION, "crc32": str(crc)}
        )
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".safetensors")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return len(blob)

    def get(self, key: str) -> ChunkKV | None:
        """The stored cache, or None if missing or damaged (a damaged file is logged and deleted)."""
        path = self.path(key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            self.misses += 1
            return None
        problem = self._check(blob)
        if problem:
            log.warning(
                "damaged cache file %s (%s): ignored and removed; it will be recomputed", path, problem
            )
            path.unlink(missing_ok=True)
            self.misses += 1
            return None
        tensors = st_load(blob)
        self.hits += 1
        return ChunkKV(tensors["k"], tensors["v"])

    @staticmethod
    def _check(blob: bytes) -> str | None:
        if len(blob) < 8:
            return "truncated"
        try:
            crc, header_len = _data_crc(blob)
            header = json.loads(blob[8 : 8 + header_len])
            meta = header.get("__metadata__", {})
        except (ValueError, UnicodeDecodeError):
            return "unreadable header"
        if meta.get("format") != "turborag-kv" or meta.get("version") != FORMAT_VERSION:
            return "not a turborag cache of this format version"
        if str(crc) != meta.get("crc32"):
            return "checksum mismatch"
        if set(header) - {"__metadata__"} != {"k", "v"}:
            return "unexpected tensors"
        return None
