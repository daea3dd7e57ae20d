"""turbo-ape (core/ape.py): APE's temperature and scaling over an assembled turbo context.

- With temperature 1 and scale 1 it is plain attention: turbo-ape gives turbo's logits (1e-5, fp32), on
  every tiny architecture, Gemma 3's trimmed sliding layers included, for the question and for decoding.
- The weights are what the paper writes: a direct computation, context and other keys apart, of
  softmax_C(x / T) scaled to C's share exp(S*T*LSE_C) against the other keys' exp(x).
- Other settings change the answer's logits, and a batch of turbo-ape rows decodes as each row alone.
"""

from __future__ import annotations

import math

import pytest
import torch

from turborag.core import ape
from turborag.core.batch import DecodeBatch
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


def _logits(engine: Engine, mode: str, tokens: int = 6) -> torch.Tensor:
    """The first-token logits and those of a few greedy decode steps, (tokens, vocab)."""
    seq = engine.begin(Q, PASSAGES, mode, SamplingParams(max_new_tokens=tokens, stop_at_newline=False))
    out = [seq.logits.clone()]
    for _ in range(tokens - 1):
        seq.advance()
        if seq.finished:
            break
        engine.step(seq)
        out.append(seq.logits.clone())
    return torch.stack(out)


@pytest.mark.parametrize("mode", ["turbo-ape", "turbo-ape-epic"])
def test_temperature_and_scale_one_is_plain_attention(tiny_lm, tmp_path, mode):
    engine = Engine(
        tiny_lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(ape_temperature=1.0, ape_scale=1.0)
    )
    plain = "turbo" if mode == "turbo-ape" else "turbo-epic"
    a, b = _logits(engine, mode), _logits(engine, plain)
    assert a.shape == b.shape
    assert (a - b).abs().max().item() < 1e-5


def test_sliding_layers_hold_the_tail_and_ape_still_matches(gemma_lm, tmp_path):
    """The tiny Gemma 3 has a 16-token window: its sliding layers hold only the context's tail, so the
    context span is shifted there; with T = S = 1 the result is still turbo's."""
    engine = Engine(
        gemma_lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(ape_temperature=1.0, ape_scale=1.0)
    )
    seq = engine.begin(Q, PASSAGES, "turbo-ape")
    offsets = [getattr(layer, "offset", 0) for layer in seq.cache.layers]
    assert max(offsets) > 0  # some layer dropped the start of the context
    a, b = _logits(engine, "turbo-ape"), _logits(engine, "turbo")
    assert (a - b).abs().max().item() < 1e-5


def test_other_settings_change_the_logits(tiny_lm, tmp_path):
    engine = Engine(
        tiny_lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(ape_temperature=0.5, ape_scale=0.7)
    )
    assert (_logits(engine, "turbo-ape", 1) - _logits(engine, "turbo", 1)).abs().max().item() > 1e-4


def _direct(x: torch.Tensor, is_context: list[bool], t: float, s: float) -> torch.Tensor:
    """APE's weights for one query row, written out as in the paper: two partial softmaxes merged by
    their log-sum-exps, the context's scaled by S*T after its logits were divided by T."""
    c = [i for i, flag in enumerate(is_context) if flag]
    o = [i for i, flag in enumerate(is_context) if not flag]
    lse_c = math.log(sum(math.exp(x[i].item() / t) for i in c))
    lse_o = math.log(sum(math.exp(x[i].item()) for i in o))
    mass_c, mass_o = math.exp(s * t * lse_c), math.exp(lse_o)
    z = mass_c + mass_o
    out = torch.zeros(len(x), dtype=torch.float64)
    for i in c:
        out[i] = math.exp(x[i].item() / t - lse_c) * mass_c / z
    for i in o:
        out[i] = math.exp(x[i].item() - lse_o) * mass_o / z
    return out


@pytest.mark.parametrize("t,s", [(1.0, 1.0), (0.9, 0.9), (0.5, 1.3), (2.0, 0.4)])
def test_weights_are_the_papers_formula(t, s):
    torch.manual_seed(1)
    k = 12
    logits = torch.randn(1, 2, 3, k) * 3  # (B, H, T, K)
    context = torch.zeros(1, 1, 1, k, dtype=torch.bool)
    context[..., 2:8] = True  # prefix 0-1, context 2-7, question 8-11
    visible = torch.ones(1, 1, 3, k, dtype=torch.bool)
    visible[..., 2, 11] = visible[..., 0, 10:] = visible[..., 1, 11] = False  # causal among the question
    probs = ape.adjusted_probs(logits, visible, context, t, s)
    for h in range(2):
        for q in range(3):
            seen = visible[0, 0, q].nonzero().flatten().tolist()
            want = _direct(logits[0, h, q, seen], [bool(context[0, 0, 0, j]) for j in seen], t, s)
            got = probs[0, h, q, seen].double()
            assert torch.allclose(got, want, atol=1e-6), (h, q)
            assert probs[0, h, q].sum().item() == pytest.approx(1.0, abs=1e-6)
            assert probs[0, h, q, [j for j in range(k) if j not in seen]].abs().max() == 0


def test_no_visible_context_is_plain_softmax():
    logits = torch.randn(1, 1, 1, 5)
    visible = torch.ones(1, 1, 1, 5, dtype=torch.bool)
    context = torch.zeros(1, 1, 1, 5, dtype=torch.bool)
    probs = ape.adjusted_probs(logits, visible, context, 0.5, 0.5)
    assert torch.allclose(probs, torch.softmax(logits, -1), atol=1e-7)


def test_the_model_is_switched_back_after_use(tiny_lm, tmp_path):
    engine = Engine(tiny_lm, KVStore(tmp_path, cache_format="float32"))
    before = tiny_lm.model.config._attn_implementation
    engine.answer(Q, PASSAGES, "turbo-ape", SamplingParams(max_new_tokens=3))
    assert tiny_lm.model.config._attn_implementation == before


def test_a_batch_of_ape_rows_decodes_as_each_alone(gemma_lm, tmp_path):
    """Greedy tokens of turbo-ape requests decoded together equal their tokens decoded alone (invariant 6),
    with a plain turbo row in the same batch."""
    engine = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"))
    params = SamplingParams(max_new_tokens=8, stop_at_newline=False)
    cases = [
        (Q, PASSAGES, "turbo-ape"),
        ("Where is Brem?", PASSAGES[1:], "turbo"),
        (Q, PASSAGES[:1], "turbo-ape"),
    ]
    alone = [engine.answer(q, p, m, params).token_ids for q, p, m in cases]
    seqs = [engine.begin(q, p, m, params) for q, p, m in cases]
    batch = DecodeBatch(gemma_lm.model, engine.windows)
    done: dict[int, list[int]] = {}
    while len(done) < len(seqs):
        running = []
        for i, seq in enumerate(seqs):
            if i in done:
                continue
            items = seq.advance()
            if seq.finished:
                done[i] = items[-1].token_ids
            else:
                running.append(seq)
        if running:
            batch.step(running)
    assert [done[i] for i in range(len(seqs))] == alone
