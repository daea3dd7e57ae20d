"""The decode steps' single-query attention (core/decode_attention.py) gives SDPA's logits, on every family
(grouped K/V heads, Gemma's sliding windows), one sequence or a padded batch; prefills stay SDPA's exactly."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHS, char_tokenizer, make

from turborag.core import decode_attention
from turborag.core.batch import DecodeBatch
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.model import LoadedModel, fingerprint
from turborag.store.kv_store import KVStore

PASSAGES = ["Alice keeps bees by the river. " * 6, "Bob mends nets in the harbour. " * 5]
QUESTIONS = ["What does Alice keep?", "Where does Bob mend nets, and what?"]


def _engine(tmp_path, kind: str, switched: bool) -> Engine:
    model, tok = make(kind), char_tokenizer()
    if switched:
        decode_attention.use(model)
    lm = LoadedModel(model, tok, kind, fingerprint(model, tok), torch.device("cpu"), torch.float32)
    return Engine(lm, KVStore(tmp_path / kind / str(switched), cache_format="float32"))


def _steps(engine: Engine, question: str, mode: str, n: int = 5) -> list[torch.Tensor]:
    seq = engine.begin(question, PASSAGES, mode, SamplingParams(max_new_tokens=n + 1, min_tokens=n + 1))
    out = [seq.logits.clone()]
    for _ in range(n):
        seq.advance()
        engine.step(seq)
        out.append(seq.logits.clone())
    return out


@pytest.mark.parametrize("kind", ARCHS)
def test_decode_steps_give_sdpa_s_logits(tmp_path, kind):
    sdpa, short = _engine(tmp_path, kind, False), _engine(tmp_path, kind, True)
    assert short.lm.model.config._attn_implementation == decode_attention.NAME
    assert short.lm.fingerprint == sdpa.lm.fingerprint  # not part of what a store is bound to
    for mode in ("full", "turbo"):
        got, want = _steps(short, QUESTIONS[0], mode), _steps(sdpa, QUESTIONS[0], mode)
        assert torch.equal(got[0], want[0])  # the prefill is SDPA's own
        for g, w in zip(got[1:], want[1:]):
            assert (g - w).abs().max() < 1e-4


def test_a_padded_batch_gives_each_row_its_own_logits(tmp_path):
    engine = _engine(tmp_path, "gemma3", True)
    params = SamplingParams(max_new_tokens=6, min_tokens=6)
    alone = []
    for q in QUESTIONS:
        seq = engine.begin(q, PASSAGES, "turbo", params)
        seq.advance()
        engine.step(seq)
        alone.append(seq.logits)
    rows = [engine.begin(q, PASSAGES, "turbo", params) for q in QUESTIONS]  # prompts of two lengths
    for seq in rows:
        seq.advance()
    DecodeBatch(engine.lm.model, engine.windows).step(rows)
    for seq, want in zip(rows, alone):
        assert (seq.logits - want).abs().max() < 1e-4
