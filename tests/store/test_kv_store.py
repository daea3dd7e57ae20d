"""Store round trips and damage detection (docs/ARCHITECTURE.md, invariant 4)."""

from __future__ import annotations

import torch

from turborag.store.chunk_kv import ChunkKV
from turborag.store.kv_store import KVStore, cache_key


def _kv(seed=0, tokens=7) -> ChunkKV:
    g = torch.Generator().manual_seed(seed)
    return ChunkKV(torch.randn(3, 2, tokens, 8, generator=g), torch.randn(3, 2, tokens, 8, generator=g))


def test_round_trip_is_bit_identical_in_store_dtype(tmp_path):
    for dtype in ("float32", "float16", "bfloat16"):
        store = KVStore(tmp_path / dtype, dtype=dtype)
        kv = _kv()
        store.put("ab" * 32, kv)
        back = store.get("ab" * 32)
        assert back.k.dtype == store.torch_dtype
        assert torch.equal(back.k, kv.k.to(store.torch_dtype))
        assert torch.equal(back.v, kv.v.to(store.torch_dtype))


def test_missing_is_none(tmp_path):
    store = KVStore(tmp_path)
    assert store.get("cd" * 32) is None and store.misses == 1


def test_damaged_file_detected_and_removed(tmp_path):
    store = KVStore(tmp_path)
    key = "ef" * 32
    store.put(key, _kv())
    path = store.path(key)
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 0xFF  # flip bits in the tensor data
    path.write_bytes(bytes(blob))
    assert store.get(key) is None
    assert not path.exists()


def test_truncated_and_garbage_files(tmp_path):
    store = KVStore(tmp_path)
    for i, junk in enumerate(
        [b"", b"1234", b"\xff" * 100, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......"]
    ):
        key = f"{i:02d}" * 32
        store.path(key).parent.mkdir(parents=True, exist_ok=True)
        store.path(key).write_bytes(junk)
        assert store.get(key) is None


def test_no_temp_files_left(tmp_path):
    store = KVStore(tmp_path)
    store.put("12" * 32, _kv())
    assert [p.name for p in (tmp_path / "kv" / "12").iterdir()] == ["12" * 32 + ".safetensors"]


def test_key_depends_on_everything():
    base = cache_key("fp", [1, 2], [3, 4])
    assert base != cache_key("fp2", [1, 2], [3, 4])
    assert base != cache_key("fp", [1], [3, 4])
    assert base != cache_key("fp", [1, 2], [3, 5])
    assert base != cache_key("fp", [1, 2], [3, 4], dtype="float32")
    assert base == cache_key("fp", [1, 2], [3, 4])
