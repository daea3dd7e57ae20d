"""The engine end to end on tiny models: modes agree where they must, stores are used, inputs are checked."""

from __future__ import annotations

import pytest

from turborag.core.defaults import UNTUNED_MODE
from turborag.core.engine import Answer, Engine, PromptTooLong
from turborag.core.generate import SamplingParams
from turborag.core.modes import MODES
from turborag.store.kv_store import KVStore

PASSAGES = [
    "Veltrano Dynamics was founded in 1911 by Ismena Throll in the city of Quorvik.",
    "The river Sallow runs through Brem, a town known for its blue bridges.",
    "Cobalt Orchard is a band from Tarsk whose first album came out in 1987.",
]
Q = "Who founded Veltrano?"


def test_one_chunk_generation_same_in_full_and_turbo(tiny_lm, tmp_path):
    engine = Engine(tiny_lm, KVStore(tmp_path, cache_format="float32"))
    engine.stop_ids = set()  # a random model may emit EOS first: compare 12 tokens, never an empty answer
    params = SamplingParams(max_new_tokens=12)
    for passage in PASSAGES:
        full = engine.answer(Q, [passage], "full", params)
        turbo = engine.answer(Q, [passage], "turbo", params)
        comp = engine.answer(Q, [passage], "turbo-composite", params)
        assert len(full.token_ids) > 0
        assert full.token_ids == turbo.token_ids == comp.token_ids


def test_cached_tokens_and_store_use(gemma_lm, tmp_path):
    store = KVStore(tmp_path)
    engine = Engine(gemma_lm, store)
    computed, tokens = engine.precompute(PASSAGES)
    assert computed == 3 and tokens > 0
    assert engine.precompute(PASSAGES) == (0, 0)  # content-addressed: nothing to redo
    params = SamplingParams(max_new_tokens=4)
    full = engine.answer(Q, PASSAGES, "full", params)
    turbo = engine.answer(Q, PASSAGES, "turbo", params)
    assert full.cached_tokens == 0
    assert turbo.cached_tokens == len(engine.prefix_ids) + tokens
    assert turbo.prompt_tokens == full.prompt_tokens == turbo.cached_tokens + len(engine.layout.suffix_ids(Q))
    assert turbo.computed_chunks == 0 and store.hits >= 3


def test_missing_cache_is_computed_on_the_fly(gemma_lm, tmp_path):
    engine = Engine(gemma_lm, KVStore(tmp_path))
    a = engine.answer(Q, PASSAGES, "turbo", SamplingParams(max_new_tokens=2))
    assert a.computed_chunks == 3
    b = engine.answer(Q, PASSAGES, "turbo", SamplingParams(max_new_tokens=2))
    assert b.computed_chunks == 0 and b.token_ids == a.token_ids


def test_fp16_store_close_to_fp32(gemma_lm, tmp_path):
    """Storing caches in fp16 changes the next-token logits only slightly."""
    import torch

    from turborag.core import hf_compat, kv

    engine32 = Engine(gemma_lm, KVStore(tmp_path / "a", cache_format="float32"))
    engine16 = Engine(gemma_lm, KVStore(tmp_path / "b", cache_format="float16"))
    outs = []
    for engine in (engine32, engine16):
        prompt = engine.layout.build(Q, PASSAGES)
        engine.precompute(PASSAGES)
        chunks = [engine.store.get(engine.key(c)).to("cpu", torch.float32) for c in prompt.chunks]
        cache, pos = kv.assemble(engine.prefix_kv, chunks, engine.inv_freq)
        suffix = torch.tensor([prompt.suffix])
        with torch.no_grad():
            outs.append(
                hf_compat.forward(
                    gemma_lm.model, suffix, torch.arange(pos, pos + suffix.shape[1])[None], cache
                )
            )
    diff = (outs[0] - outs[1]).abs().max().item()
    assert 0 < diff < 1e-2


def test_streaming_yields_text_then_answer(gemma_lm, tmp_path):
    engine = Engine(gemma_lm, KVStore(tmp_path))
    items = list(engine.stream(Q, PASSAGES, "turbo", SamplingParams(max_new_tokens=8)))
    assert isinstance(items[-1], Answer)
    assert all(isinstance(x, str) for x in items[:-1])
    assert "".join(items[:-1]).strip() == items[-1].text
    assert items[-1].ttft_s <= items[-1].total_s


def test_bad_mode_and_too_long_prompt(gemma_lm, tmp_path):
    engine = Engine(gemma_lm, KVStore(tmp_path))
    with pytest.raises(ValueError, match="unknown mode"):
        engine.answer(Q, PASSAGES, "warp", SamplingParams(max_new_tokens=1))
    gemma_lm.model.config.max_position_embeddings = 64
    with pytest.raises(PromptTooLong, match="context window of 64"):
        engine.answer(Q, PASSAGES, "full", SamplingParams(max_new_tokens=1))


def test_sampling_is_seeded(gemma_lm, tmp_path):
    engine = Engine(gemma_lm, KVStore(tmp_path))
    p = SamplingParams(max_new_tokens=10, temperature=1.5, top_p=0.9, top_k=50, seed=7)
    a = engine.answer(Q, PASSAGES, "turbo", p)
    b = engine.answer(Q, PASSAGES, "turbo", p)
    c = engine.answer(Q, PASSAGES, "turbo", SamplingParams(max_new_tokens=10, temperature=1.5, seed=8))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_modes_constant():
    assert MODES[:4] == ("auto", "full", "turbo", "turbo-composite")
    assert set(MODES[4:]) == {"turbo-epic", "turbo-blend", "turbo-ape", "turbo-ape-epic"}


@pytest.mark.parametrize("cache_aware,expected", [(True, "turbo"), (False, UNTUNED_MODE)])
def test_auto_is_turbo_only_on_a_cache_aware_model(gemma_lm, tmp_path, cache_aware, expected):
    gemma_lm.cache_aware = cache_aware
    engine = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"))
    p = SamplingParams(max_new_tokens=6)
    auto = engine.answer(Q, PASSAGES, "auto", p)
    assert auto.mode == expected and engine.answer(Q, PASSAGES, params=p).mode == expected
    assert auto.token_ids == engine.answer(Q, PASSAGES, expected, p).token_ids
    assert (engine.auto_notice() is None) == cache_aware
    if not cache_aware:
        assert UNTUNED_MODE in engine.auto_notice() and "turborag finetune" in engine.auto_notice()


@pytest.mark.parametrize(
    "meta,aware",
    [(None, False), ({"causal": False}, True), ({"causal": True}, False), ({"cache_aware": False}, False)],
)
def test_cache_aware_is_read_from_the_fine_tune_record(tmp_path, meta, aware):
    import json

    from turborag.core.model import adapter_dir_for, is_cache_aware

    if meta is not None:
        (tmp_path / "turborag_finetune.json").write_text(json.dumps(meta))
    assert is_cache_aware(tmp_path) is aware
    assert is_cache_aware(adapter_dir_for("gemma-3-270m-turbo"))  # the shipped adapter


def test_batched_chunk_tokenization_equals_one_by_one(gemma_lm):
    """build() tokenizes all passages in one call; each must get exactly the ids it gets alone."""
    from turborag.core.prompt import PromptLayout

    layout = PromptLayout(gemma_lm.tokenizer)
    texts = ["Short.", "  A longer passage, with punctuation; and spaces.  ", "x" * 300, "Ünïcode ✓"]
    assert layout.chunks_ids(texts) == [layout.chunk_ids(t) for t in texts]
    assert layout.build("Q?", texts).chunks == [layout.chunk_ids(t) for t in texts]


def test_passage_memo_is_bounded_and_returns_copies(gemma_lm, monkeypatch):
    from turborag.core import prompt

    monkeypatch.setattr(prompt, "MEMO_PASSAGES", 3)
    layout = prompt.PromptLayout(gemma_lm.tokenizer)
    first = layout.chunks_ids(["a", "b", "a"])
    first[0].append(999)  # a caller's list is its own
    assert layout.chunks_ids(["a"]) == [layout.chunk_ids("a")]
    layout.chunks_ids(["c", "d", "e"])
    assert list(layout._memo) == ["c", "d", "e"]


def test_passage_memo_is_safe_across_threads(gemma_lm, monkeypatch):
    """A server builds prompts on its model thread and on request threads (the context-window check before
    queueing): many threads over a small memo, switching often, each get their own passages' ids."""
    import sys
    import threading

    from turborag.core import prompt

    monkeypatch.setattr(prompt, "MEMO_PASSAGES", 2)
    layout = prompt.PromptLayout(gemma_lm.tokenizer)
    words = [f"passage {i}" for i in range(40)]
    want = {w: layout.chunk_ids(w) for w in words}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for n in range(60):
                texts = [words[(k * 7 + n + j) % len(words)] for j in range(3)]
                assert layout.chunks_ids(texts) == [want[t] for t in texts]
        except BaseException as e:  # reported below
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:1]


def test_keys_are_memoized_per_engine_and_stay_its_own(gemma_lm, tmp_path):
    """engine.key remembers keys by token ids; an engine over another cache format keeps its own keys."""
    from turborag.store.kv_store import cache_key

    fp32 = Engine(gemma_lm, KVStore(tmp_path / "a", cache_format="float32"))
    fp16 = Engine(gemma_lm, KVStore(tmp_path / "b", cache_format="float16"))
    ids = fp32.layout.chunk_ids(PASSAGES[0])
    for engine, fmt in ((fp32, "float32"), (fp16, "float16"), (fp32, "float32")):
        want = cache_key(gemma_lm.fingerprint, engine.prefix_ids, ids, fmt)
        assert engine.key(ids) == engine.key(tuple(ids)) == want
    assert fp32.key(ids) != fp16.key(ids) and fp32.key(ids[:-1]) != fp32.key(ids)
    assert fp32._keys.cache_info().hits >= 3
