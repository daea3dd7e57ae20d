"""A query-side adapter runs on the question and answer only: the context stays the frozen base's."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import char_tokenizer, make

from turborag.core import query_adapter
from turborag.core.batch import DecodeBatch
from turborag.core.engine import Engine
from turborag.core.feeds import feed_together
from turborag.core.generate import SamplingParams
from turborag.core.model import load_model
from turborag.store.kv_store import KVStore

PASSAGES = [
    "Veltrano was founded by Ismena Throll in the year of the long frost.",
    "The Sallow runs through Brem and meets the sea at Orrin.",
    "Cobalt Orchard sings in the evening.",
]
QUESTION = "Who founded Veltrano?"


def _adapter(tmp_path, kind: str = "qwen2"):
    """A tiny base model folder and a random (non-zero) query-side LoRA adapter folder for it."""
    from peft import LoraConfig, get_peft_model

    base = tmp_path / "base"
    make(kind).save_pretrained(base)
    char_tokenizer().save_pretrained(base)
    torch.manual_seed(1)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(make(kind), cfg)
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    (adapter / "turborag_finetune.json").write_text(
        json.dumps({"model": str(base), "side": "query", "cache_aware": True})
    )
    return base, adapter


@pytest.mark.parametrize("kind", ["qwen2", "gemma3"])
def test_one_store_serves_base_and_adapter(kind, tmp_path):
    """The adapted model reads the base's store with nothing recomputed, and the caches it would compute
    are bit-identical to the base's; turbo answers differ (the adapter reads the question), full do not."""
    base, adapter = _adapter(tmp_path, kind)
    store_dir = tmp_path / "store"
    plain = load_model(str(base), "cpu", "float32")
    adapted = load_model(str(adapter), "cpu", "float32")
    assert query_adapter.attached(adapted.model) and not query_adapter.attached(plain.model)
    assert adapted.fingerprint == plain.fingerprint and adapted.cache_aware

    e_base = Engine(plain, KVStore(store_dir, cache_format="float32"))
    e_base.precompute(PASSAGES)
    e_adapted = Engine(adapted, KVStore(store_dir, cache_format="float32"))
    keys = [e_base.key(ids) for ids in map(e_base.layout.chunk_ids, PASSAGES)]
    assert keys == [e_adapted.key(ids) for ids in map(e_adapted.layout.chunk_ids, PASSAGES)]

    # the caches the adapted engine computes (into its own store) equal the base's bit for bit
    other = Engine(adapted, KVStore(tmp_path / "other", cache_format="float32"))
    assert other.precompute(PASSAGES)[0] == len(PASSAGES)
    for k in keys:
        a, b = e_base.store.get(k), other.store.get(k)
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    assert torch.equal(e_adapted.prefix_kv.k, e_base.prefix_kv.k)
    assert torch.equal(e_adapted.prefix_kv.v, e_base.prefix_kv.v)

    params = SamplingParams(max_new_tokens=6)
    turbo_base = e_base.answer(QUESTION, PASSAGES, "turbo", params)
    turbo_adapted = e_adapted.answer(QUESTION, PASSAGES, "turbo", params)
    assert turbo_adapted.computed_chunks == 0  # the base's store, read as it is
    full_base = e_base.answer(QUESTION, PASSAGES, "full", params)
    full_adapted = e_adapted.answer(QUESTION, PASSAGES, "full", params)
    assert full_adapted.token_ids == full_base.token_ids  # full is the base model
    # the adapter changes what turbo reads off the question (first-token logits differ)
    seq_a = e_adapted.begin(QUESTION, PASSAGES, "turbo", params)
    seq_b = e_base.begin(QUESTION, PASSAGES, "turbo", params)
    assert (seq_a.logits - seq_b.logits).abs().max() > 1e-3
    assert turbo_base.computed_chunks == 0


def test_mixed_rows_equal_each_alone(tmp_path):
    """A batched prefill and decode step mixing adapter rows (turbo) and base rows (full) gives each row
    the logits it gets alone."""
    _, adapter = _adapter(tmp_path)
    lm = load_model(str(adapter), "cpu", "float32")
    engine = Engine(lm, KVStore(tmp_path / "store", cache_format="float32"))
    engine.precompute(PASSAGES)
    # min_tokens: a random model may pick EOS first on some CPUs, which would leave no step to compare
    params = SamplingParams(max_new_tokens=4, min_tokens=4)
    alone = [engine.begin(QUESTION, PASSAGES, m, params) for m in ("turbo", "full")]
    assert [s.adapter for s in alone] == [True, False]

    # the question prefill of a turbo request and the last prefill forward of a full one, in one forward
    n = len(engine.layout.build(QUESTION, PASSAGES).ids)
    turbo = engine.begin_steps(QUESTION, PASSAGES, "turbo", params, defer=True)
    full = engine.begin_steps(QUESTION, PASSAGES, "full", params, step=n - 4, defer=True)
    first = next(full)
    last = full.send(first.run())  # the full prompt's first forward runs alone (an empty cache)
    together = feed_together([next(turbo), last], engine.windows)
    for got, seq in zip(together, alone):
        assert (got[-1] - seq.logits).abs().max() < 1e-4

    # one decode step of both rows together, against each stepped alone
    for seq in alone:
        seq.advance()
    batch = DecodeBatch(lm.model, engine.windows)
    rows = [engine.begin(QUESTION, PASSAGES, m, params) for m in ("turbo", "full")]
    for seq in rows:
        seq.advance()
    batch.step(rows)
    for seq in alone:
        engine.step(seq)
    for got, want in zip(rows, alone):
        assert (got.logits - want.logits).abs().max() < 1e-4


def test_adapter_is_off_outside_its_forwards(tmp_path):
    """After a turbo answer the model is the base again: a plain forward equals the base model's."""
    base, adapter = _adapter(tmp_path)
    lm = load_model(str(adapter), "cpu", "float32")
    plain = load_model(str(base), "cpu", "float32")
    Engine(lm, KVStore(tmp_path / "s", cache_format="float32")).answer(
        QUESTION, PASSAGES, "turbo", SamplingParams(max_new_tokens=3)
    )
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(lm.model(x).logits, plain.model(x).logits)
        with query_adapter.active(lm.model, True):
            assert not torch.equal(lm.model(x).logits, plain.model(x).logits)
