"""Store round trips and damage detection (docs/ARCHITECTURE.md, invariant 4)."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as st_save

from turborag.store import codec
from turborag.store.chunk_kv import ChunkKV
from turborag.store.kv_store import FILE_FORMAT, KEY_VERSION, KVStore, StoredChunk, cache_key


def _kv(seed=0, tokens=7) -> ChunkKV:
    g = torch.Generator().manual_seed(seed)
    return ChunkKV(torch.randn(3, 2, tokens, 8, generator=g), torch.randn(3, 2, tokens, 8, generator=g))


def test_round_trip_is_bit_identical_in_store_dtype(tmp_path):
    for dtype in ("float32", "float16", "bfloat16"):
        store = KVStore(tmp_path / dtype, cache_format=dtype)
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
    assert base != cache_key("fp", [1, 2], [3, 4], cache_format="float32")
    assert base == cache_key("fp", [1, 2], [3, 4])


# -- format 2: per-layer tensors, per-tensor hashes, mmap reads ----------------------------------------------


def _kv_layers(seed=0, layers=5, tokens=7) -> ChunkKV:
    g = torch.Generator().manual_seed(seed)
    shape = (layers, 2, tokens, 8)  # (L, H, T, D)
    return ChunkKV(torch.randn(shape, generator=g), torch.randn(shape, generator=g))


def _header(path) -> tuple[int, dict]:
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    return n, json.loads(blob[8 : 8 + n])


def _write_format1(store: KVStore, key: str, kv: ChunkKV) -> None:
    """A cache file exactly as the format-1 `put` wrote it: stacked `k`, `v` and a CRC32 of the data."""
    tensors = {
        "k": kv.k.to(store.torch_dtype).contiguous(),  # (L, H, T, D)
        "v": kv.v.to(store.torch_dtype).contiguous(),  # (L, H, T, D)
    }
    plain = st_save(tensors)
    n = int.from_bytes(plain[:8], "little")
    crc = zlib.crc32(plain[8 + n :])
    blob = st_save(tensors, metadata={"format": "turborag-kv", "version": "1", "crc32": str(crc)})
    store.path(key).parent.mkdir(parents=True, exist_ok=True)
    store.path(key).write_bytes(blob)


def test_key_unchanged_by_file_format():
    # Computed by the format-1 code before the file format changed: it guards existing stores, whose keys
    # (and catalogs) must stay valid. Change it only with a new KEY_VERSION, knowing every store goes stale.
    assert cache_key("fp", [1, 2], [3, 4]) == (
        "e9c7e9cb5db4c2583e7eb5061c11a310550bf59db78d80cd44ddacc2024b673f"
    )
    assert (
        cache_key("gemma-3-270m:abc", [2, 105, 2364], [818, 5279, 529, 506], cache_format="bfloat16")
        == "f83726008774eb90cc07ac90c546a0fc8317e494bec64520601b5668066a5f68"
    )
    assert KEY_VERSION == "1" and FILE_FORMAT == "2"


def test_put_writes_format_2(tmp_path):
    store = KVStore(tmp_path, cache_format="bfloat16")
    key = "a1" * 32
    store.put(key, _kv_layers(layers=4, tokens=6))
    _, header = _header(store.path(key))
    meta = header.pop("__metadata__")
    assert meta["format"] == "turborag-kv" and meta["version"] == "2"
    assert meta["layers"] == "4" and meta["tokens"] == "6"
    assert set(header) == {f"{kind}.{i}" for i in range(4) for kind in "kv"}
    assert all(e["shape"] == [2, 6, 8] and e["dtype"] == "BF16" for e in header.values())
    assert all(len(meta[f"xxh3.{name}"]) == 16 for name in header)
    assert store.file_format(key) == "2" and store.file_format("ff" * 32) is None


def test_format_2_round_trip_bit_identical_through_get_and_get_layers(tmp_path):
    for dtype in ("float16", "bfloat16", "float32"):
        store = KVStore(tmp_path / dtype, cache_format=dtype)
        key = "b2" * 32
        kv = _kv_layers()
        want_k, want_v = kv.k.to(store.torch_dtype), kv.v.to(store.torch_dtype)
        store.put(key, kv)
        back = store.get(key)
        assert back.k.dtype == store.torch_dtype and back.k.shape == (5, 2, 7, 8)
        assert torch.equal(back.k, want_k) and torch.equal(back.v, want_v)
        every = store.get_layers(key)
        assert len(every) == 5
        for i, (k, v) in enumerate(every):
            assert k.shape == (2, 7, 8) and k.dtype == store.torch_dtype
            assert torch.equal(k, want_k[i]) and torch.equal(v, want_v[i])
        some = store.get_layers(key, [4, 1])
        assert [p is None for p in some] == [True, False, True, True, False]
        assert torch.equal(some[1][0], want_k[1]) and torch.equal(some[4][1], want_v[4])
        assert store.hits == 3 and store.misses == 0


def _open_fds_of(path) -> list[str]:
    target = os.path.realpath(path)
    fds = Path("/proc/self/fd")
    return [f.name for f in fds.iterdir() if os.path.realpath(f) == target] if fds.is_dir() else []


def test_get_layers_reads_only_the_header_and_the_layers_asked_for(tmp_path, monkeypatch):
    """A file is read in ranges: the 8-byte length, the header, then exactly the bytes of each requested
    tensor, nothing of the other layers; the file is closed once decoded, and the tensors own their bytes."""
    store = KVStore(tmp_path, cache_format="bfloat16")
    key = "c3" * 32
    kv = _kv_layers(layers=4, tokens=64)
    store.put(key, kv)
    n, header = _header(store.path(key))
    reads = []
    real = os.preadv

    def preadv(fd, buffers, offset):
        reads.append((offset, offset + sum(len(b) for b in buffers)))
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", preadv)
    layers = store.get_layers(key, [0, 2])
    tensors = [(0, 8), (8, 8 + n)] + sorted(
        tuple(8 + n + o for o in header[f"{kind}.{i}"]["data_offsets"]) for i in (0, 2) for kind in "kv"
    )
    assert sorted(reads) == tensors
    assert layers[1] is None and layers[3] is None
    for i in (0, 2):
        assert torch.equal(layers[i][0], kv.k[i].bfloat16()) and torch.equal(layers[i][1], kv.v[i].bfloat16())
    if Path("/proc/self/fd").is_dir():
        assert not _open_fds_of(store.path(key))
    store.path(key).write_bytes(
        b"\0" * store.path(key).stat().st_size
    )  # the file's bytes are not the tensors'
    assert torch.equal(layers[0][0], kv.k[0].bfloat16())


def test_a_file_cut_while_it_is_read_is_damage(tmp_path):
    """The size is taken when the file is opened; a file cut after that reads short, which is damage
    (never a tensor over missing bytes)."""
    store = KVStore(tmp_path)
    key = "c4" * 32
    store.put(key, _kv_layers())
    blob = store.backend.get(key)
    os.truncate(store.path(key), len(blob) - 100)
    with pytest.raises(codec.Damaged, match="truncated"):
        codec.decode(blob, store.cache_format)


def _flip(path, offset: int) -> None:
    blob = bytearray(path.read_bytes())
    blob[offset] ^= 0xFF
    path.write_bytes(bytes(blob))


def test_damage_in_an_unread_layer_is_not_seen_until_that_layer_is_read(tmp_path):
    """A flipped byte in layer 3's K: a request for layer 0 still succeeds, by design — layer 3's bytes are
    neither read nor used, and verifying them would cost the reads that format 2 exists to avoid. The
    damage is caught (and the file removed) as soon as anything asks for layer 3: get_layers, get, or
    `cache verify` (which reads every layer)."""
    store = KVStore(tmp_path)
    key = "d4" * 32
    kv = _kv_layers()
    for read in (lambda: store.get_layers(key, [3]), lambda: store.get(key)):
        store.put(key, kv)
        n, header = _header(store.path(key))
        start, end = header["k.3"]["data_offsets"]
        _flip(store.path(key), 8 + n + (start + end) // 2)
        first = store.get_layers(key, [0])
        assert first is not None and torch.equal(first[0][0], kv.k[0].half()) and first[3] is None
        del first
        assert read() is None
        assert not store.path(key).exists()
    assert store.hits == 2 and store.misses == 2


def test_damaged_format_2_files_are_none_never_an_exception(tmp_path):
    store = KVStore(tmp_path)
    kv = _kv_layers()
    key = "e5" * 32

    def damaged(blob: bytes) -> None:
        store.put(key, kv)
        store.path(key).write_bytes(blob)
        assert store.get_layers(key, [0]) is None
        assert not store.path(key).exists()

    store.put(key, kv)
    good = store.path(key).read_bytes()
    n, header = _header(store.path(key))
    damaged(good[:-10])  # truncated: the last tensor runs past the end
    damaged(good[: 8 + n // 2])  # truncated inside the header
    damaged(good[:8] + b"\xff" * n + good[8 + n :])  # garbage header
    damaged((10**12).to_bytes(8, "little") + good[8:])  # header length beyond the file

    def with_header(change) -> bytes:
        h = json.loads(good[8 : 8 + n])
        change(h)
        raw = json.dumps(h, separators=(",", ":")).encode()
        assert len(raw) <= n
        return good[:8] + raw.ljust(n) + good[8 + n :]  # same length: the data section stays in place

    damaged(with_header(lambda h: h["k.0"].update(data_offsets=[0, len(good) * 2])))  # beyond the file
    damaged(with_header(lambda h: h["k.0"].update(shape=[2, 7, 9])))  # shape and size disagree
    damaged(with_header(lambda h: h["k.0"].update(dtype="F32")))  # not the store dtype
    damaged(with_header(lambda h: h["__metadata__"].update(version="9")))  # unknown version
    damaged(with_header(lambda h: h["__metadata__"].update({"xxh3.v.0": "0" * 16})))  # hash mismatch
    damaged(with_header(lambda h: h.pop("v.4")))  # a tensor missing
    assert store.hits == 0 and store.misses == 10


def test_layer_outside_the_cache_is_the_callers_error_and_keeps_the_file(tmp_path):
    store = KVStore(tmp_path)
    key = "f6" * 32
    store.put(key, _kv_layers(layers=3))
    with pytest.raises(IndexError):
        store.get_layers(key, [3])
    assert store.path(key).exists() and store.get_layers(key, [2]) is not None


def test_format_1_is_still_read_and_migrates_to_format_2(tmp_path):
    for dtype in ("float16", "bfloat16", "float32"):
        store = KVStore(tmp_path / dtype, cache_format=dtype)
        key = "a7" * 32
        kv = _kv_layers(layers=4)
        want_k, want_v = kv.k.to(store.torch_dtype), kv.v.to(store.torch_dtype)
        _write_format1(store, key, kv)
        assert store.file_format(key) == "1"
        back = store.get(key)
        assert torch.equal(back.k, want_k) and torch.equal(back.v, want_v)
        some = store.get_layers(key, [2])
        assert [p is None for p in some] == [True, True, False, True]
        assert torch.equal(some[2][0], want_k[2]) and torch.equal(some[2][1], want_v[2])

        store.put(key, store.get(key))  # what `cache verify --migrate` does
        assert store.file_format(key) == "2"
        again = store.get(key)
        assert torch.equal(again.k, want_k) and torch.equal(again.v, want_v)


def test_damaged_format_1_is_none_whatever_layer_is_asked(tmp_path):
    store = KVStore(tmp_path)
    key = "b8" * 32
    _write_format1(store, key, _kv_layers())
    _flip(store.path(key), -5)  # inside v's last layer; format 1 checks the whole data section
    assert store.get_layers(key, [0]) is None and not store.path(key).exists()


def test_cache_verify_counts_formats_and_migrates(tmp_path):
    # The CLI's store-level command, on a catalog with cache entries only (no model needed).
    from typer.testing import CliRunner

    from turborag.cli import app
    from turborag.store.catalog import Catalog, NewChunk

    root = tmp_path / "store"
    catalog = Catalog(root, create=True)
    catalog.set_meta(store_dtype="bfloat16")
    store = KVStore(root, cache_format="bfloat16")
    keys = [f"{i:02x}" * 32 for i in range(4)]
    chunks = []
    for i, key in enumerate(keys):
        if i < 2:
            _write_format1(store, key, _kv_layers(seed=i))
            nbytes = store.path(key).stat().st_size
        else:
            nbytes = store.put(key, _kv_layers(seed=i))
        chunks.append(NewChunk(f"doc#{i}", i, "text", 7, "h", key, b"\0" * 4, nbytes))
    catalog.replace_document("doc", "doc", "fh", "ch", chunks)
    catalog.close()
    runner = CliRunner()

    r = runner.invoke(app, ["cache", "verify", "--store", str(root), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out == {"ok": 4, "missing": 0, "damaged": 0, "formats": {"1": 2, "2": 2}}
    assert "format-1 caches (2) are still read" in r.stderr and "--migrate" in r.stderr

    r = runner.invoke(app, ["cache", "verify", "--store", str(root), "--migrate"])
    assert r.exit_code == 0, r.output
    assert "format 2: 2, format 1: 2" in r.stderr and "2 migrated to format 2" in r.stderr
    assert [store.file_format(k) for k in keys] == ["2"] * 4
    stats = json.loads(runner.invoke(app, ["cache", "stats", "--store", str(root), "--json"]).stdout)
    assert stats["cache_bytes"] == stats["disk_bytes"]  # the catalog knows the new sizes

    r = runner.invoke(app, ["cache", "verify", "--store", str(root), "--json"])
    assert json.loads(r.stdout)["formats"] == {"1": 0, "2": 4} and "format 1" not in r.stderr


def test_get_many_layers_reads_each_key_as_get_layers_does(tmp_path):
    """Many keys in one call (one get_many from the backend): each result, the counters and the removal of a
    damaged blob are those of one get_layers call per key, and a caller's bad layer index still raises."""
    store = KVStore(tmp_path)
    kvs = {f"{i:02x}" * 32: _kv_layers(seed=i) for i in range(6)}
    for key, kv in kvs.items():
        store.put(key, kv)
    keys = list(kvs)
    damaged, missing = keys[2], "ee" * 32
    n, header = _header(store.path(damaged))
    start, end = header["v.1"]["data_offsets"]
    _flip(store.path(damaged), 8 + n + start)
    wanted = {key: [1, 3] for key in keys} | {missing: [0]}
    got = store.get_many_layers(wanted)
    assert list(got) == list(wanted)
    assert got[damaged] is None and got[missing] is None and not store.path(damaged).exists()
    for key in keys:
        if key != damaged:
            assert got[key][0] is None and got[key][2] is None
            for i in (1, 3):
                assert torch.equal(got[key][i][0], kvs[key].k[i].half())
                assert torch.equal(got[key][i][1], kvs[key].v[i].half())
    assert store.hits == 5 and store.misses == 2
    with pytest.raises(IndexError):
        store.get_many_layers({keys[0]: [0], keys[1]: [9]})
    assert store.path(keys[1]).exists()


def test_open_many_opens_sound_blobs_reports_missing_and_damaged_ones_and_decodes_format_1(tmp_path):
    """What serving assembly reads in place (TieredStore.read): a format-2 blob comes back open, its tensors
    unread; a missing or damaged one is a miss (a damaged one deleted); format 1 is decoded whole."""
    torch.manual_seed(0)
    chunk = ChunkKV(torch.randn(2, 1, 4, 8), torch.randn(2, 1, 4, 8))
    store = KVStore(tmp_path, "float32")
    good, torn, old, missing = "1" * 64, "2" * 64, "3" * 64, "4" * 64
    store.put(good, chunk)
    store.backend.put(torn, b"\x10" + bytes(20))
    _write_format1(store, old, chunk)
    found = store.open_many({good: [0], torn: [0], old: [1], missing: [0]})
    assert isinstance(found[good], StoredChunk) and found[good].tokens == 4
    out = torch.empty(1, 4, 8)
    found[good].read_into(1, "v", out)
    assert torch.equal(out, chunk.v[1])
    assert found[torn] is None and torn not in store  # damaged: deleted
    assert found[missing] is None
    assert found[old][0] is None and torch.equal(found[old][1][0], chunk.k[1])
    assert (store.hits, store.misses) == (2, 2)
    with pytest.raises(ValueError, match="dequantizes"):
        KVStore(tmp_path, "int8").open_many({good: [0]})


def test_a_scope_keys_the_same_chunk_apart_and_no_scope_keeps_the_old_key():
    import hashlib
    import json

    from turborag.store.kv_store import KEY_VERSION, cache_key

    old = hashlib.sha256(json.dumps([KEY_VERSION, "fp", "float16", [1], [2, 3]]).encode()).hexdigest()
    assert cache_key("fp", [1], [2, 3], "float16") == old  # every store built so far keeps its keys
    scoped = {cache_key("fp", [1], [2, 3], "float16", scope) for scope in ("red", "blue")}
    assert len(scoped) == 2 and old not in scoped
