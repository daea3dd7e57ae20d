"""Prompt caching for plain prompts: reuse is exact, reported, bounded."""

from __future__ import annotations

import torch

from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.options import EngineOptions
from turborag.core.prefix_cache import PrefixCache, block_keys
from turborag.store.kv_store import KVStore

SYSTEM = "You are a careful agent. Tools: search(query), open(url), calc(expr). Always think first. " * 3


def _ids(engine, text):
    return [engine.lm.tokenizer.bos_token_id] + engine.layout._encode(text)


def test_reuse_is_exact_and_reported(tiny_lm, tmp_path):
    engine = Engine(tiny_lm, KVStore(tmp_path), EngineOptions(prefix_block=16))
    cold = Engine(tiny_lm, KVStore(tmp_path), EngineOptions(prefix_block=16))  # never sees step 1
    params = SamplingParams(max_new_tokens=8)
    first = list(engine.complete_stream(_ids(engine, SYSTEM + "User: step one"), params))[-1]
    assert first.cached_tokens == 0
    prompt2 = _ids(engine, SYSTEM + "User: step two, please")
    warm = list(engine.complete_stream(prompt2, params))[-1]
    ref = list(cold.complete_stream(prompt2, params))[-1]
    shared = len(_ids(engine, SYSTEM + "User: step "))
    assert warm.cached_tokens == (shared // 16) * 16 > 0
    assert ref.cached_tokens == 0
    assert warm.token_ids == ref.token_ids
    assert warm.prompt_tokens == len(prompt2)


def test_identical_prompt_keeps_one_token_to_prefill(gemma_lm, tmp_path):
    engine = Engine(gemma_lm, KVStore(tmp_path), EngineOptions(prefix_block=8))
    ids = _ids(engine, "exactly thirty-two characters!!")[:32]
    assert len(ids) == 32
    a = list(engine.complete_stream(ids, SamplingParams(max_new_tokens=4)))[-1]
    b = list(engine.complete_stream(ids, SamplingParams(max_new_tokens=4)))[-1]
    assert b.cached_tokens == 24  # blocks of the first 31 tokens; the last token is prefilled for its logits
    assert a.token_ids == b.token_ids


def _kv(tokens, fill=0.0):
    """Model-cache layout: per layer (k, v), each (batch 1, heads 1, tokens, 4)."""
    return [(torch.full((1, 1, tokens, 4), fill), torch.full((1, 1, tokens, 4), fill)) for _ in range(2)]


def test_lru_bound_and_chaining():
    cache = PrefixCache(block_size=4, max_tokens=8)
    cache.insert(list(range(12)), _kv(12))
    assert len(cache) == 2  # 3 blocks, room for 2: the oldest went
    assert cache.match(list(range(12)))[0] == 0  # chained: without block 0 nothing matches
    cache2 = PrefixCache(block_size=4, max_tokens=64)
    cache2.insert([1, 2, 3, 4, 5, 6, 7, 8], _kv(8))
    n, kv = cache2.match([1, 2, 3, 4, 5, 6, 7, 9, 9])
    assert n == 4 and kv.tokens == 4
    assert block_keys([1, 2, 3, 4], 4, "model-a") != block_keys([1, 2, 3, 4], 4, "model-b")
