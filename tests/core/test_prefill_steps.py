"""A prefill in steps (Engine.begin_steps): a prompt fed in forwards of at most `prefill_step` tokens gives
the logits of one forward (fp32, 1e-4), on every tiny architecture, across Gemma 3's sliding window, in full
and turbo modes (with the abstention reply riding along) and for plain prompts."""

from __future__ import annotations

import pytest
import torch

from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.options import EngineOptions
from turborag.store.kv_store import KVStore

Q = "Who founded Veltrano, and in which city did the founder live when the company was started?"
PASSAGES = [
    "Veltrano Dynamics was founded in 1911 by Ismena Throll in the city of Quorvik.",
    "The river Sallow runs through Brem, a town known for its blue bridges.",
    "Cobalt Orchard is a band from Tarsk whose first album came out in 1987.",
]
PARAMS = SamplingParams(max_new_tokens=5, stop_at_newline=False)


def _run(engine: Engine, seq) -> torch.Tensor:
    """First-token logits, then those of each greedy decode step, (tokens, vocab)."""
    out = [seq.logits.clone()]
    while True:
        seq.advance()
        if seq.finished:
            return torch.stack(out)
        engine.step(seq)
        out.append(seq.logits.clone())


@pytest.mark.parametrize("mode", ["full", "turbo", "turbo-ape"])
def test_prefill_in_steps_equals_one_forward(tiny_lm, tmp_path, mode):
    whole = Engine(tiny_lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(prefill_step=100_000))
    stepped = Engine(tiny_lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(prefill_step=7))
    a = _run(whole, whole.begin(Q, PASSAGES, mode, PARAMS))
    b = _run(stepped, stepped.begin(Q, PASSAGES, mode, PARAMS))
    assert a.shape == b.shape
    assert (a - b).abs().max().item() < 1e-4


def test_prefill_in_steps_with_the_abstention_reply(gemma_lm, tmp_path):
    """The reply is fed after the prompt (engine.reply_logprob): its logits must come from one forward
    even when the chunks would split them."""
    gemma_lm.abstain_threshold = 0.99
    whole = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(prefill_step=100_000))
    stepped = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(prefill_step=5))
    a = whole.answer(Q, PASSAGES, "full", PARAMS)
    b = stepped.answer(Q, PASSAGES, "full", PARAMS)
    assert a.abstain_logprob == pytest.approx(b.abstain_logprob, abs=1e-4)
    assert a.token_ids == b.token_ids


def test_steps_yield_each_forward_and_cover_the_prompt(gemma_lm, tmp_path):
    engine = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(prefill_step=16))
    steps = engine.begin_steps(Q, PASSAGES, "full", PARAMS)
    counts = []
    while True:
        try:
            counts.append(next(steps))
        except StopIteration as done:
            seq = done.value
            break
    assert len(counts) > 3 and max(counts) <= 16
    assert sum(counts) == seq.prompt_tokens  # full: every prompt token, once
    turbo = engine.begin_steps(Q, PASSAGES, "turbo", PARAMS)
    assert sum(list(turbo)) < seq.prompt_tokens  # turbo: only the question


def test_plain_prompt_stepped(gemma_lm, tmp_path):
    ids = gemma_lm.tokenizer(" ".join(PASSAGES) + " " + Q)["input_ids"]
    whole = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(prefill_step=100_000))
    stepped = Engine(gemma_lm, KVStore(tmp_path / "b", cache_format="float32"), EngineOptions(prefill_step=9))
    a = _run(whole, whole.begin_prompt(ids, PARAMS))
    b = _run(stepped, stepped.begin_prompt(ids, PARAMS))
    assert (a - b).abs().max().item() < 1e-4


def test_prefill_step_must_be_positive(gemma_lm, tmp_path):
    with pytest.raises(ValueError, match="prefill_step"):
        Engine(gemma_lm, KVStore(tmp_path), EngineOptions(prefill_step=0))
