"""Training-free recompute: recomputing every token after the first chunk must give exactly full prefill."""

from __future__ import annotations

import torch

from turborag.core import hf_compat, kv, recompute
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.options import EngineOptions
from turborag.store.kv_store import KVStore

Q = "Who founded Veltrano?"
PASSAGES = [
    "Veltrano Dynamics was founded in 1911 by Ismena Throll in the city of Quorvik.",
    "The river Sallow runs through Brem, a town known for its blue bridges.",
    "Cobalt Orchard is a band from Tarsk whose first album came out in 1987.",
]


def _suffix_logits(engine: Engine, selected_fn) -> tuple[torch.Tensor, torch.Tensor]:
    """(turbo logits after recomputing selected_fn(p, lengths), full-prefill logits) over the suffix."""
    model = engine.lm.model
    prompt = engine.layout.build(Q, PASSAGES)
    engine.precompute(PASSAGES)
    chunks = [engine.store.get(engine.key(c)) for c in prompt.chunks]
    cache, next_pos = kv.assemble(engine.prefix_kv, chunks, engine.inv_freq)
    p, lengths = len(prompt.prefix), [len(c) for c in prompt.chunks]
    ids = prompt.prefix + [t for c in prompt.chunks for t in c]
    recompute.recompute(model, cache, ids, list(range(len(ids))), selected_fn(p, lengths, cache, ids))
    s = torch.tensor([prompt.suffix])
    with torch.no_grad():
        turbo = hf_compat.forward(model, s, torch.arange(next_pos, next_pos + s.shape[1])[None], cache)[0]
        full = hf_compat.forward(
            model, torch.tensor([prompt.ids]), torch.arange(len(prompt.ids))[None], hf_compat.new_cache()
        )[0, -s.shape[1] :]
    return turbo, full


def test_recomputing_everything_after_chunk0_is_exact(tiny_lm, tmp_path):
    engine = Engine(tiny_lm, KVStore(tmp_path, cache_format="float32"))
    turbo, full = _suffix_logits(engine, lambda p, lengths, *_: list(range(p + lengths[0], p + sum(lengths))))
    assert (turbo - full).abs().max().item() < 1e-4


def test_blend_ratio_one_is_exact_and_zero_is_turbo(tiny_lm, tmp_path):
    engine = Engine(tiny_lm, KVStore(tmp_path, cache_format="float32"))

    def blend(ratio):
        def pick(p, lengths, cache, ids):
            return recompute.blend_indices(
                tiny_lm.model, cache, ids, list(range(len(ids))), p + lengths[0], ratio
            )

        return pick

    turbo, full = _suffix_logits(engine, blend(1.0))
    assert (turbo - full).abs().max().item() < 1e-4
    plain, full = _suffix_logits(engine, blend(0.0))
    assert (plain - full).abs().max().item() > 1e-4  # nothing recomputed: still the approximation


def test_blend_picks_deviating_tokens_not_first_chunk(gemma_lm, tmp_path):
    engine = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"))
    picked = {}

    def pick(p, lengths, cache, ids):
        sel = recompute.blend_indices(gemma_lm.model, cache, ids, list(range(len(ids))), p + lengths[0], 0.2)
        picked["sel"], picked["first"], picked["n"] = sel, p + lengths[0], len(ids)
        return sel

    _suffix_logits(engine, pick)
    assert len(picked["sel"]) == round(0.2 * (picked["n"] - picked["first"]))
    assert min(picked["sel"]) >= picked["first"]


def test_epic_indices():
    assert recompute.epic_indices(3, [4, 2, 5], k=2) == [7, 8, 9, 10]
    assert recompute.epic_indices(3, [4, 2, 5], k=3) == [7, 8, 9, 10, 11]  # k capped by chunk length
    assert recompute.epic_indices(3, [4], k=2) == []


def test_engine_modes_report_recomputed_tokens(gemma_lm, tmp_path):
    engine = Engine(gemma_lm, KVStore(tmp_path), EngineOptions(recompute_k=4, recompute_ratio=0.25))
    params = SamplingParams(max_new_tokens=3)
    turbo = engine.answer(Q, PASSAGES, "turbo", params)
    epic = engine.answer(Q, PASSAGES, "turbo-epic", params)
    blend = engine.answer(Q, PASSAGES, "turbo-blend", params)
    assert turbo.cached_tokens - epic.cached_tokens == 8  # 4 tokens of chunks 1 and 2
    assert blend.cached_tokens < turbo.cached_tokens
    k0 = Engine(gemma_lm, KVStore(tmp_path), EngineOptions(recompute_k=0))
    assert k0.answer(Q, PASSAGES, "turbo-epic", params).token_ids == turbo.token_ids


def test_recompute_modes_with_one_kv_head(tmp_path):
    """Gemma 3 270M has one KV head: the in-place move of recomputed K/V must not trip over shared storage
    (this failed on the real model before the copy in hf_compat.move_tail)."""
    from conftest import COMMON, char_tokenizer
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from turborag.core.model import LoadedModel, fingerprint

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        **{**COMMON, "num_key_value_heads": 1},
        head_dim=16,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"] * 2,
    )
    model, tok = Gemma3ForCausalLM(cfg).eval(), char_tokenizer()
    lm = LoadedModel(model, tok, "tiny-1kv", fingerprint(model, tok), torch.device("cpu"), torch.float32)
    engine = Engine(lm, KVStore(tmp_path), EngineOptions(recompute_k=4, recompute_ratio=0.2))
    for mode in ("turbo-epic", "turbo-blend"):
        a = engine.answer(Q, PASSAGES, mode, SamplingParams(max_new_tokens=3))
        assert a.completion_tokens >= 1 and a.cached_tokens < a.prompt_tokens
