"""Invariant 5: a sliding-window layer holds (and the store reads) only the tail of the context it can see.

On a tiny Gemma 3 whose 3 sliding layers have a 16-token window and whose 4th layer is global, serving with
the trimmed sliding layers gives the same logits as holding the whole context, within 1e-4 in fp32: for
contexts shorter and longer than the window, with one and many chunks, in both position modes, for the
question prefill and for every step of a greedy decode that runs past the window.
"""

from __future__ import annotations

import pytest
import torch

from turborag.core import hf_compat, kv
from turborag.core.arch import layer_inv_freq, layer_windows
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.prompt import PromptLayout
from turborag.store.kv_store import KVStore, StoredChunk

CPU = torch.device("cpu")
QUESTION = "Who founded it?"
LONG = [
    "Veltrano Dynamics was founded in 1911 by Ismena Throll in the city of Quorvik.",
    "The river Sallow runs through Brem, a town known for its blue bridges.",
    "Cobalt Orchard is a band from Tarsk whose first album came out in 1987.",
]


def _decode_both(model, prompt, chunks, prefix, positions, steps):
    """Logits of the question and `steps` greedy tokens, from a trimmed and from a whole assembly."""
    inv = torch.stack(layer_inv_freq(model))
    windows = layer_windows(model)
    assert windows.count(None) == 1 and len(set(windows)) == 2  # the fixture: 3 sliding layers, 1 global
    caches = []
    for w in (windows, None):
        cache, next_pos = kv.assemble_into(prefix, chunks, inv, positions, CPU, torch.float32, 4, w)
        caches.append(cache)
    x = torch.tensor([prompt.suffix])
    pos = torch.arange(next_pos, next_pos + x.shape[1])[None]
    out = []
    with torch.no_grad():
        for _ in range(steps + 1):
            pair = [hf_compat.forward(model, x, pos, cache)[0, -1] for cache in caches]
            out.append(pair)
            nxt = int(pair[1].argmax())  # both decode the untrimmed path's token
            x, pos = torch.tensor([[nxt]]), pos[:, -1:] + 1
    return caches, out


@pytest.mark.parametrize("positions", ["reordered", "composite"])
@pytest.mark.parametrize("passages", [LONG[:1], LONG], ids=["one-chunk", "many-chunks"])
def test_trimmed_sliding_layers_give_the_same_logits(gemma_lm, positions, passages):
    model = gemma_lm.model
    prompt = PromptLayout(gemma_lm.tokenizer).build(QUESTION, passages)
    prefix = kv.prefill_prefix(model, prompt.prefix)
    chunks = kv.precompute_chunks(model, prefix, prompt.chunks)
    caches, pairs = _decode_both(model, prompt, chunks, prefix, positions, steps=24)  # 24 > window
    for trimmed, whole in pairs:
        assert (trimmed - whole).abs().max().item() < 1e-4
    n = len(prompt.prefix) + sum(len(c) for c in prompt.chunks)
    held = [layer.offset for layer in caches[0].layers if layer.is_sliding]
    assert held == [max(0, n - 15)] * 3  # only the last W - 1 = 15 context entries are held
    if n > 16:
        assert caches[0].layers[0].k_buf.shape[-2] < caches[1].layers[0].k_buf.shape[-2]


@pytest.mark.parametrize("positions", ["reordered", "composite"])
def test_context_shorter_than_the_window_and_a_decode_that_crosses_it(positions):
    """Window larger than the context: nothing is dropped at first, and the decode runs past the window."""
    from conftest import char_tokenizer, tiny_gemma3

    tok = char_tokenizer()
    prompt = PromptLayout(tok).build(QUESTION, LONG[:2])
    n = len(prompt.prefix) + sum(len(c) for c in prompt.chunks)
    torch.manual_seed(0)
    model = tiny_gemma3(sliding_window=n + 8).eval()  # question (16 tokens) + decode cross it
    prefix = kv.prefill_prefix(model, prompt.prefix)
    chunks = kv.precompute_chunks(model, prefix, prompt.chunks)
    caches, pairs = _decode_both(model, prompt, chunks, prefix, positions, steps=24)
    assert [layer.offset for layer in caches[0].layers if layer.is_sliding] == [0, 0, 0]
    for trimmed, whole in pairs:
        assert (trimmed - whole).abs().max().item() < 1e-4


def test_needed_layers_skip_sliding_layers_before_the_window():
    windows = [16, 16, None, 16]
    # prefix 4, chunks of 10, 10, 10: context 34 entries, sliding layers hold [19, 34)
    assert kv.needed_layers([10, 10, 10], 4, windows) == [[2], [0, 1, 2, 3], [0, 1, 2, 3]]
    assert kv.needed_layers([3, 3], 4, windows) == [[0, 1, 2, 3], [0, 1, 2, 3]]  # all inside the window
    assert kv.needed_layers([10, 10], 4, [None] * 4) == [[0, 1, 2, 3]] * 2


class _CountingStore(KVStore):
    """Records which layers of each chunk the engine reads: those it asks for (a store read into buffers of
    its own) or those it reads in place (a store in the compute dtype, read straight into the serving
    buffers)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.asked: list[set[int]] = []

    def get_many_layers(self, wanted):
        self.asked.extend(set(range(99)) if layers is None else set(layers) for layers in wanted.values())
        return super().get_many_layers(wanted)

    def open_many(self, wanted):
        found = super().open_many(wanted)
        for chunk in found.values():
            if isinstance(chunk, StoredChunk):
                layers: set[int] = set()
                self.asked.append(layers)
                chunk.read_into = _recording(chunk.read_into, layers)
        return found


def _recording(read_into, layers: set[int]):
    def read(layer, kind, out):
        layers.add(layer)
        return read_into(layer, kind, out)

    return read


@pytest.mark.parametrize("cache_format", ["float32", "float16"], ids=["in-place", "copied"])
def test_engine_reads_only_needed_layers_and_answers_as_untrimmed(gemma_lm, tmp_path, cache_format):
    store = _CountingStore(tmp_path, cache_format)
    engine = Engine(gemma_lm, store)
    assert engine.caches.in_place == (cache_format == "float32")  # the model computes in fp32
    params = SamplingParams(max_new_tokens=24)
    engine.precompute(LONG * 2)
    trimmed = engine.answer(QUESTION, LONG * 2, "turbo", params)
    assert sorted(map(len, store.asked))[0] == 1  # a chunk before the window: its global layer only
    engine.windows = [None] * len(engine.windows)  # the untrimmed path, same stored caches
    whole = engine.answer(QUESTION, LONG * 2, "turbo", params)
    assert trimmed.token_ids == whole.token_ids and len(trimmed.token_ids) == 24
    assert trimmed.cached_tokens == whole.cached_tokens
