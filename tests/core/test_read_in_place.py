"""Reading chunk caches in place: with no RAM tier, on the CPU, from a store in the compute dtype, assembly
reads each tensor from the store straight into the serving buffers (TieredStore.read, kv.assemble_into).

The cache it builds must be the one the copying path builds from the same store, bit for bit: every
architecture (two KV heads, so each head is its own run of bytes in the buffer), both position modes, sliding
layers that hold only a tail (a chunk cut by the window start goes through the scratch buffer), in fp32 and
bf16. A tensor that fails its hash halfway through assembly is deleted and computed again, and the request
answers as if nothing had happened.
"""

from __future__ import annotations

import logging

import pytest
import torch

from turborag.core import hf_compat, kv
from turborag.core.arch import layer_inv_freq, layer_windows
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.prompt import PromptLayout
from turborag.store import codec
from turborag.store.kv_store import KVStore, StoredChunk

CPU = torch.device("cpu")
QUESTION = "Who founded it?"
PASSAGES = [
    "Veltrano Dynamics was founded in 1911 by Ismena Throll in the city of Quorvik.",
    "The river Sallow runs through Brem, a town known for its blue bridges.",
    "Cobalt Orchard is a band from Tarsk whose first album came out in 1987.",
]


def _stored(lm, tmp_path, dtype: torch.dtype):
    """The passages' chunk caches in a store of `dtype`; (store, prompt, prefix, keys)."""
    model = lm.model.to(dtype)
    prompt = PromptLayout(lm.tokenizer).build(QUESTION, PASSAGES)
    with torch.no_grad():
        prefix = kv.prefill_prefix(model, prompt.prefix)
        chunks = kv.precompute_chunks(model, prefix, prompt.chunks)
    store = KVStore(tmp_path, str(dtype).removeprefix("torch."))
    keys = [f"{i:064x}" for i in range(len(chunks))]
    for key, chunk in zip(keys, chunks):
        store.put(key, chunk)
    return store, prompt, prefix, keys


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("positions", ["reordered", "composite"])
def test_in_place_assembly_equals_the_copying_one(tiny_lm, tmp_path, dtype, positions):
    store, prompt, prefix, keys = _stored(tiny_lm, tmp_path, dtype)
    model = tiny_lm.model
    inv, windows = torch.stack(layer_inv_freq(model)), layer_windows(model)
    lengths = [len(c) for c in prompt.chunks]
    wanted = kv.needed_layers(lengths, len(prompt.prefix), windows)
    copied = [store.get_layers(k, w) for k, w in zip(keys, wanted)]
    opened = store.open_many(dict(zip(keys, wanted)))
    assert all(isinstance(c, StoredChunk) for c in opened.values())
    in_place = [opened[k] for k in keys]
    caches = [
        kv.assemble_into(prefix, chunks, inv, positions, CPU, dtype, 4, windows, lengths)
        for chunks in (copied, in_place)
    ]
    assert caches[0][1] == caches[1][1]  # the question's first position
    layers = [hf_compat.cache_layers(cache) for cache, _ in caches]
    for (ka, va), (kb, vb) in zip(*layers):
        assert ka.dtype == dtype and torch.equal(ka, kb) and torch.equal(va, vb)
    if any(windows):  # Gemma 3: some sliding layer holds a tail that starts inside a chunk
        n = len(prompt.prefix) + sum(lengths)
        starts = {kv.window_start(n, w) for w in windows if w}
        assert any(len(prompt.prefix) < s < n for s in starts)


def test_a_tensor_damaged_on_disk_is_computed_again_and_the_answer_is_unchanged(gemma_lm, tmp_path, caplog):
    store = KVStore(tmp_path, "float32")  # the model computes in fp32: read in place
    engine = Engine(gemma_lm, store)
    assert engine.caches.in_place
    params = SamplingParams(max_new_tokens=12)
    engine.precompute(PASSAGES)
    want = engine.answer(QUESTION, PASSAGES, "turbo", params)
    assert want.computed_chunks == 0

    prompt = engine.layout.build(QUESTION, PASSAGES)
    key = engine.key(prompt.chunks[1])
    global_layer = engine.windows.index(None)
    path = store.path(key)
    raw = bytearray(path.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    header, _ = codec.decode_header(bytes(raw[8 : 8 + header_len]))
    start, end = header[f"k.{global_layer}"]["data_offsets"]
    raw[8 + header_len + (start + end) // 2] ^= 0x40  # one bit in the middle of a tensor every request reads
    path.write_bytes(raw)
    assert codec.open_reader(bytes(raw), "float32") is not None  # the header is sound: found while assembling

    with caplog.at_level(logging.WARNING):
        got = engine.answer(QUESTION, PASSAGES, "turbo", params)
    assert got.token_ids == want.token_ids and got.computed_chunks == 1
    assert f"hash mismatch in k.{global_layer}" in caplog.text
    assert store.get_layers(key) is not None  # computed and stored again, sound
    assert engine.answer(QUESTION, PASSAGES, "turbo", params).computed_chunks == 0


def test_read_into_fills_each_head_and_checks_the_hash(tmp_path):
    torch.manual_seed(0)
    k, v = torch.randn(3, 2, 5, 8), torch.randn(3, 2, 5, 8)  # (L, H, T, D)
    blob = codec.encode(kv.ChunkKV(k, v), "float32")
    store = KVStore(tmp_path, "float32")
    store.backend.put("a" * 64, blob)
    for buf in (bytes(blob), store.backend.get("a" * 64)):  # in memory (Redis) and a file
        reader = codec.open_reader(buf, "float32")
        assert reader.layers == 3 and reader.tokens == 5
        out = torch.full((1, 2, 9, 8), float("nan"))  # (1, H, N, D): the tensor goes to [2, 7)
        reader.read_into(1, "v", out[0, :, 2:7])
        assert torch.equal(out[0, :, 2:7], v[1])
        assert out[0, :, :2].isnan().all() and out[0, :, 7:].isnan().all()  # nothing else written
        with pytest.raises(ValueError, match="given"):
            reader.read_into(1, "k", torch.empty(2, 4, 8))  # not this blob's shape
        with pytest.raises(ValueError, match="float32"):
            reader.read_into(1, "k", torch.empty(2, 5, 8, dtype=torch.float16))
        with pytest.raises(IndexError):
            reader.read_into(3, "k", torch.empty(2, 5, 8))

    bad = bytearray(blob)
    bad[-3] ^= 1  # the last tensor, v.2
    reader = codec.open_reader(bytes(bad), "float32")
    reader.read_into(2, "k", torch.empty(2, 5, 8))  # an undamaged tensor reads
    with pytest.raises(codec.Damaged, match="hash mismatch in v.2"):
        reader.read_into(2, "v", torch.empty(2, 5, 8))
    with pytest.raises(codec.Damaged):
        codec.open_reader(bytes(blob[:-3]), "float32")  # cut short: the header says more
    with pytest.raises(ValueError, match="dequantized"):
        codec.open_reader(bytes(blob), "int8")
