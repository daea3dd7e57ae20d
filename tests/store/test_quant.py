"""Quantized store formats, int8 and fp8 (codec.py): exact round trips, error bounds, size, damage."""

from __future__ import annotations

import json

import pytest
import torch

from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.store import codec
from turborag.store.chunk_kv import ChunkKV
from turborag.store.kv_store import KVStore

QUANT = ["int8", "fp8"]


def _kv(seed=0, layers=5, heads=2, tokens=7, head_dim=8) -> ChunkKV:
    g = torch.Generator().manual_seed(seed)
    shape = (layers, heads, tokens, head_dim)  # (L, H, T, D)
    return ChunkKV(torch.randn(shape, generator=g), torch.randn(shape, generator=g))


def _rope(x: torch.Tensor, start: int, theta: float = 10000.0) -> torch.Tensor:
    """HF-style RoPE of x (..., T, D) at positions start .. start + T - 1."""
    d, t = x.shape[-1], x.shape[-2]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # (D/2,)
    angle = torch.arange(start, start + t, dtype=torch.float64)[:, None] * inv  # (T, D/2)
    angle = torch.cat((angle, angle), dim=-1)  # (T, D)
    half = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
    return x * angle.cos().float() + half * angle.sin().float()


def _outlier_kv(seed=0, layers=4, heads=2, tokens=256, head_dim=64) -> ChunkKV:
    """Caches shaped like real ones: keys with per-channel magnitudes, a few channels 20x the others and a
    per-channel offset, rotated by RoPE as stored (a scale per channel covers a rotated pair); values with a
    per-token magnitude."""
    g = torch.Generator().manual_seed(seed)
    shape = (layers, heads, tokens, head_dim)
    mag = torch.exp(0.7 * torch.randn(layers, heads, 1, head_dim, generator=g))  # (L, H, 1, D)
    mag[..., :4] *= 20
    mag[..., head_dim // 2 + 10] *= 20
    bias = 2 * mag * (torch.rand(layers, heads, 1, head_dim, generator=g) - 0.5)
    k = _rope(torch.randn(shape, generator=g) * mag + bias, start=30)
    v = torch.randn(shape, generator=g) * torch.exp(0.5 * torch.randn(layers, heads, tokens, 1, generator=g))
    return ChunkKV(k, v)


def _rel(x_hat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Relative Frobenius error per (layer, head): (L, H, T, D) -> (L, H)."""
    return (x_hat.float() - x).flatten(2).norm(dim=-1) / x.flatten(2).norm(dim=-1)


def _header(path) -> tuple[int, dict]:
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    return n, json.loads(blob[8 : 8 + n])


def _flip(path, offset: int) -> None:
    blob = bytearray(path.read_bytes())
    blob[offset] ^= 0xFF
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("fmt", QUANT)
def test_round_trip_equals_as_stored_exactly(tmp_path, fmt):
    store = KVStore(tmp_path, cache_format=fmt)
    assert store.cache_format == fmt and store.torch_dtype == torch.float16 and store.quantized
    key = "a1" * 32
    kv = _kv()
    want = store.as_stored(kv)
    assert want.k.dtype == torch.float16 and want.k.shape == kv.k.shape
    store.put(key, kv)
    back = store.get(key)
    assert torch.equal(back.k, want.k) and torch.equal(back.v, want.v)
    some = store.get_layers(key, [4, 1])
    assert [p is None for p in some] == [True, False, True, True, False]
    assert torch.equal(some[1][0], want.k[1]) and torch.equal(some[4][1], want.v[4])
    # the input dtype does not matter beyond its values: a bf16 chunk is quantized from its exact values
    half = ChunkKV(kv.k.bfloat16(), kv.v.bfloat16())
    assert torch.equal(store.as_stored(half).k, store.as_stored(ChunkKV(half.k.float(), half.v.float())).k)


def test_as_stored_of_a_cast_format_is_the_cast(tmp_path):
    kv = _kv()
    for fmt in ("float16", "bfloat16", "float32"):
        store = KVStore(tmp_path / fmt, cache_format=fmt)
        assert not store.quantized and store.torch_dtype == codec.DTYPES[fmt]
        assert torch.equal(store.as_stored(kv).k, kv.k.to(store.torch_dtype))
        store.put("b2" * 32, kv)
        assert torch.equal(store.get("b2" * 32).v, store.as_stored(kv).v)
    with pytest.raises(ValueError, match="int4"):
        KVStore(tmp_path, cache_format="int4")


def test_blob_layout_scales_and_metadata(tmp_path):
    for fmt, qtype, ks_shape, vs_shape in (
        ("int8", "I8", [2, 1, 8], [2, 6, 1]),  # K per channel, V per token
        ("fp8", "F8_E4M3", [2, 1, 1], [2, 1, 1]),  # per head
    ):
        store = KVStore(tmp_path / fmt, cache_format=fmt)
        key = "c3" * 32
        store.put(key, _kv(layers=3, tokens=6))
        _, header = _header(store.path(key))
        meta = header.pop("__metadata__")
        assert meta["quant"] == fmt and meta["version"] == "2" and store.file_format(key) == "2"
        assert set(header) == {f"{kind}.{i}" for i in range(3) for kind in ("k", "v", "ks", "vs")}
        assert all(len(meta[f"xxh3.{name}"]) == 16 for name in header)
        for i in range(3):
            assert header[f"k.{i}"]["dtype"] == header[f"v.{i}"]["dtype"] == qtype
            assert header[f"k.{i}"]["shape"] == header[f"v.{i}"]["shape"] == [2, 6, 8]
            assert header[f"ks.{i}"] == {**header[f"ks.{i}"], "dtype": "BF16", "shape": ks_shape}
            assert header[f"vs.{i}"] == {**header[f"vs.{i}"], "dtype": "BF16", "shape": vs_shape}


@pytest.mark.parametrize("head_dim", [64, 256])
def test_error_bounds_against_fp32(head_dim):
    """Measured (relative Frobenius error per layer and head, mean/max over 4 seeds, 256 tokens): int8 K
    0.70/0.72% on random caches, 0.81/0.96% with outlier channels after RoPE; V 0.60-0.70/0.71%; fp8 K and V
    2.64/2.76%. (Tiny models' caches: int8 K 0.6/0.7%, V 0.5/0.5%; fp8 2.7/3.0%.) Bounds: 1.2%, 1.0%, 4%.
    Per element, int8 is within half a step of x (plus float16's rounding of q * scale)."""
    for kv in (_kv(tokens=256, head_dim=head_dim, layers=4), _outlier_kv(head_dim=head_dim)):
        int8, fp8 = codec.as_stored(kv, "int8"), codec.as_stored(kv, "fp8")
        assert _rel(int8.k, kv.k).max() < 0.012 and _rel(int8.v, kv.v).max() < 0.010
        assert _rel(fp8.k, kv.k).max() < 0.04 and _rel(fp8.v, kv.v).max() < 0.04
        _, _, ks, vs = codec.quantize(kv, "int8")
        for x_hat, x, scale in ((int8.k, kv.k, ks), (int8.v, kv.v, vs)):
            step = scale.float().expand_as(x)  # (L, H, T, D)
            assert ((x_hat.float() - x).abs() <= step / 2 + x.abs() * 2**-11).all()


def test_zeros_and_large_values_stay_finite():
    kv = ChunkKV(torch.zeros(2, 1, 5, 8), torch.full((2, 1, 5, 8), 1e6))
    for fmt in QUANT:
        out = codec.as_stored(kv, fmt)
        assert torch.equal(out.k, torch.zeros_like(out.k))
        assert torch.isfinite(out.v).all() and out.v.min() > 59000  # clipped at 60000, not inf
    with pytest.raises(ValueError, match="empty"):
        codec.encode(ChunkKV(torch.zeros(2, 1, 0, 8), torch.zeros(2, 1, 0, 8)), "int8")


@pytest.mark.parametrize("fmt", QUANT)
def test_bytes_per_token_at_most_055_of_fp16(fmt):
    """Tensor bytes, scales included: int8 is 0.5 + 1/(2D) + 1/(2T) of fp16 (K scales per channel are shared
    by the chunk's T tokens, V scales cost one per token), fp8 0.5 + ~0; so a chunk of >= 16 tokens fits the
    0.55 budget. Whole blobs (header included) measured for the Gemma 3 270M shape at 256 tokens too."""
    shapes = [(18, 1, 256), (4, 2, 64), (4, 8, 64)]  # (layers, kv_heads, head_dim): Gemma 3 270M, tiny
    for layers, heads, head_dim in shapes:
        for tokens in (16, 64, 256, 1024):
            ratio = codec.tensor_bytes(fmt, layers, heads, tokens, head_dim) / codec.tensor_bytes(
                "float16", layers, heads, tokens, head_dim
            )
            assert ratio <= 0.55, (fmt, layers, heads, tokens, head_dim, ratio)
    for layers, heads, head_dim in shapes[:2]:
        kv = _kv(layers=layers, heads=heads, tokens=256, head_dim=head_dim)
        blob, fp16 = codec.encode(kv, fmt), codec.encode(kv, "float16")
        assert len(blob) <= 0.55 * len(fp16)
        n = int.from_bytes(blob[:8], "little")
        assert len(blob) - 8 - n == codec.tensor_bytes(fmt, layers, heads, 256, head_dim)


@pytest.mark.parametrize("fmt", QUANT)
def test_damage_in_an_unread_layer_or_scale_is_seen_only_when_that_layer_is_read(tmp_path, fmt):
    """As for float blobs: only the requested layers' tensors, here scales included, are hash-checked."""
    store = KVStore(tmp_path, cache_format=fmt)
    key = "d4" * 32
    kv = _kv()
    want = store.as_stored(kv)
    for name in ("k.3", "ks.3", "vs.3"):
        store.put(key, kv)
        n, header = _header(store.path(key))
        start, end = header[name]["data_offsets"]
        _flip(store.path(key), 8 + n + (start + end) // 2)
        first = store.get_layers(key, [0])
        assert first is not None and torch.equal(first[0][0], want.k[0]) and first[3] is None
        assert store.get_layers(key, [3]) is None
        assert not store.path(key).exists()


@pytest.mark.parametrize("fmt", QUANT)
def test_damaged_quantized_blobs_are_none_and_removed(tmp_path, fmt):
    store = KVStore(tmp_path, cache_format=fmt)
    kv = _kv()
    key = "e5" * 32
    store.put(key, kv)
    good = store.path(key).read_bytes()
    n = int.from_bytes(good[:8], "little")

    def damaged(blob: bytes) -> None:
        store.path(key).write_bytes(blob)
        assert store.get_layers(key, [0]) is None
        assert not store.path(key).exists()

    def with_header(change) -> bytes:
        h = json.loads(good[8 : 8 + n])
        change(h)
        raw = json.dumps(h, separators=(",", ":")).encode()
        assert len(raw) <= n
        return good[:8] + raw.ljust(n) + good[8 + n :]  # same length: the data section stays in place

    other = "fp8" if fmt == "int8" else "int8"
    damaged(with_header(lambda h: h["__metadata__"].update(quant=other)))  # another quantized format
    damaged(with_header(lambda h: h["__metadata__"].pop("quant")))  # claims to be a float16 blob
    damaged(with_header(lambda h: h["ks.0"].update(dtype="F16")))  # scale not bfloat16
    damaged(with_header(lambda h: h["k.0"].update(dtype="U8" if fmt == "int8" else "F8_E5M2")))  # q's dtype
    damaged(with_header(lambda h: h["vs.0"].update(shape=[1, 2, 1])))  # scale of the wrong shape
    damaged(with_header(lambda h: h.pop("vs.4")))  # a scale missing
    damaged(with_header(lambda h: h["__metadata__"].update({"xxh3.ks.0": "0" * 16})))  # scale hash
    damaged(good[:-3])  # truncated
    assert store.hits == 0 and store.misses == 8


def test_a_store_refuses_a_blob_of_another_format(tmp_path):
    """Keys include the format, so this only happens to a blob written under a wrong key: it is damage."""
    kv = _kv()
    for written, reader in (("float16", "int8"), ("int8", "float16"), ("fp8", "int8"), ("int8", "fp8")):
        key = "f6" * 32
        KVStore(tmp_path, cache_format=written).put(key, kv)
        store = KVStore(tmp_path, cache_format=reader)
        assert store.get_layers(key, [0]) is None and store.misses == 1
        assert not store.path(key).exists()


# -- the engine on a tiny Gemma 3 ---------------------------------------------------------------------------

PASSAGES = [
    "Veltrano Dynamics was founded in 1911 by Ismena Throll in the city of Quorvik.",
    "The river Sallow runs through Brem, a town known for its blue bridges.",
    "Cobalt Orchard is a band from Tarsk whose first album came out in 1987.",
]
QUESTIONS = [
    "Who founded Veltrano?",
    "Where does the Sallow run?",
    "When did Cobalt Orchard release an album?",
    "What is blue?",
]


def test_int8_and_fp8_stores_answer_like_fp16_in_turbo(gemma_lm, tmp_path):
    """Measured on all five tiny architectures: the first 4 tokens equal fp16's for 4/4 questions, int8 and
    fp8 alike. Asserted: the first token for at least 3 of 4 (a random model's logits are flat, so a
    flip is possible in principle)."""
    params = SamplingParams(max_new_tokens=3)
    answers = {}
    for fmt in ("float16", "int8", "fp8"):
        engine = Engine(gemma_lm, KVStore(tmp_path / fmt, cache_format=fmt))
        engine.stop_ids = set()  # compare tokens, never an empty answer
        answers[fmt] = [engine.answer(q, PASSAGES, "turbo", params).token_ids for q in QUESTIONS]
    for fmt in QUANT:
        same = sum(a[0] == b[0] for a, b in zip(answers["float16"], answers[fmt]))
        assert same >= 3, (fmt, answers)


@pytest.mark.parametrize("fmt", QUANT)
def test_a_chunk_computed_on_the_fly_equals_the_stored_one(gemma_lm, tmp_path, fmt):
    store = KVStore(tmp_path, cache_format=fmt)
    engine = Engine(gemma_lm, store)
    engine.stop_ids = set()
    ids = engine.layout.chunk_ids(PASSAGES[0])
    key = engine.key(ids)
    computed = engine._compute_and_store({key: ids}, keep=True)[key]
    stored = store.get(key)
    assert computed.k.dtype == torch.float16
    assert torch.equal(computed.k, stored.k) and torch.equal(computed.v, stored.v)
    # end to end: the request that computes its chunks answers as the one that reads them
    store.delete(key)
    params = SamplingParams(max_new_tokens=4)
    a = engine.answer(QUESTIONS[0], PASSAGES, "turbo", params)
    b = engine.answer(QUESTIONS[0], PASSAGES, "turbo", params)
    assert a.computed_chunks == 3 and b.computed_chunks == 0 and a.token_ids == b.token_ids
