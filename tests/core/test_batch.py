"""Continuous batching is exact: decoding requests together in a DecodeBatch gives, for every request, the
logits (and so the greedy tokens) it gets decoded alone.

Random mixes of requests on tiny Llama, Qwen2 and Gemma 3 models in fp32: different passages and lengths,
modes full / turbo / turbo-composite / plain prompts, requests joining and leaving mid-decode, contexts and
answers that run past Gemma's 16-token sliding window. Logits are compared at every step (within 1e-4);
tokens are compared too, except after a step whose alone-logits had a near-tie (top two within 1e-4), where
the two runs may legitimately pick different tokens and diverge: such a request is compared up to there.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import char_tokenizer, make

from turborag.core.batch import DecodeBatch
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.model import LoadedModel, fingerprint
from turborag.store.kv_store import KVStore

WORDS = "amber basalt cobalt delta ember fjord garnet harbor indigo jasper kelp lumen".split()
TOL = 1e-4


def _engine(kind: str, tmp_path) -> Engine:
    model, tok = make(kind), char_tokenizer()
    lm = LoadedModel(model, tok, f"tiny-{kind}", fingerprint(model, tok), torch.device("cpu"), torch.float32)
    engine = Engine(lm, KVStore(tmp_path / kind, cache_format="float32"))
    engine.stop_ids = set()  # random weights pick EOS early on some models: run every request its length
    return engine


def _requests(rng: random.Random, n: int) -> list[dict]:
    """n requests: a mode, 1-4 passages of 3-25 words, a question, 3-24 new tokens, a join iteration."""
    out = []
    for i in range(n):
        passages = [
            " ".join(rng.choices(WORDS, k=rng.randint(3, 25))) + "." for _ in range(rng.randint(1, 4))
        ]
        out.append(
            {
                "mode": rng.choice(["full", "turbo", "turbo-composite", "prompt"]),
                "question": f"Which word comes {i}?",
                "passages": passages,
                "params": SamplingParams(max_new_tokens=rng.randint(3, 24)),
                "join": rng.randint(0, 12),  # the iteration at which it arrives
            }
        )
    return out


def _begin(engine: Engine, r: dict):
    if r["mode"] == "prompt":
        ids = engine.lm.tokenizer(" ".join(r["passages"]) + r["question"])["input_ids"]
        return engine.begin_prompt(ids, r["params"])
    return engine.begin(r["question"], r["passages"], r["mode"], r["params"])


def _trace(seq, steps: list) -> None:
    """Record the logits a sequence is about to pick from."""
    steps.append(seq.logits.clone())


def _alone(engine: Engine, r: dict) -> tuple[list[torch.Tensor], list[int]]:
    seq, logits = _begin(engine, r), []
    while True:
        _trace(seq, logits)
        seq.advance()
        if seq.finished:
            return logits, list(seq.stream.ids)
        engine.step(seq)


def _together(engine: Engine, reqs: list[dict], max_batch: int) -> tuple[list, list, int]:
    """The server's loop in miniature: each iteration admits arrived requests (up to max_batch running),
    then one batched step for every running sequence; finished ones leave. Returns per request the logits
    and tokens, and the most rows decoded in one step."""
    batch = DecodeBatch(engine.lm.model, engine.windows)
    logits: list[list[torch.Tensor]] = [[] for _ in reqs]
    tokens: list[list[int] | None] = [None] * len(reqs)
    waiting = sorted(range(len(reqs)), key=lambda i: reqs[i]["join"])
    running: list[tuple[int, object]] = []
    it = widest = 0

    def pick(i: int, seq) -> bool:
        """Record the logits request i picks from, pick; True (its tokens kept) once it has finished."""
        _trace(seq, logits[i])
        seq.advance()
        if seq.finished:
            tokens[i] = list(seq.stream.ids)
        return seq.finished

    while waiting or running:
        while waiting and reqs[waiting[0]]["join"] <= it and len(running) < max_batch:
            i = waiting.pop(0)
            seq = _begin(engine, reqs[i])
            if not pick(i, seq):
                running.append((i, seq))
        if running:
            widest = max(widest, len(running))
            batch.step([s for _, s in running])
            running = [(i, seq) for i, seq in running if not pick(i, seq)]
        it += 1
    return logits, tokens, widest


def _compare(alone: tuple, together: tuple, what: str) -> None:
    (la, ta), (lb, tb) = alone, together
    for step, (a, b) in enumerate(zip(la, lb)):
        assert (a - b).abs().max().item() < TOL, f"{what}: logits differ at step {step}"
        top2 = torch.topk(a, 2).values
        if (top2[0] - top2[1]).item() < TOL:  # a near-tie: the two runs may pick differently from here on
            return
        if step < len(ta) and step < len(tb):
            assert ta[step] == tb[step], f"{what}: token {step} differs"
    assert ta == tb and len(la) == len(lb), what


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("seed", [0, 1])
def test_batched_decode_equals_one_at_a_time(kind, seed, tmp_path):
    engine = _engine(kind, tmp_path)
    reqs = _requests(random.Random(seed), 7)
    alone = [_alone(engine, r) for r in reqs]
    la, ta, widest = _together(engine, reqs, max_batch=4)
    assert widest >= 3  # rows really decoded together
    for i, r in enumerate(reqs):
        _compare(alone[i], (la[i], ta[i]), f"{kind} request {i} ({r['mode']})")


def test_sliding_window_is_crossed_while_batched(tmp_path):
    """Gemma's 16-token window: contexts far longer, and answers longer than the window, batched together
    with short ones (the sliding layers then hold different amounts per row)."""
    engine = _engine("gemma3", tmp_path)
    long_text = " ".join(WORDS * 3) + "."
    reqs = [
        {"mode": "turbo", "question": "What first?", "passages": [long_text, "kelp."], "join": 0},
        {"mode": "full", "question": "Why?", "passages": ["amber."], "join": 0},
        {"mode": "turbo-composite", "question": "Where?", "passages": [long_text], "join": 2},
        {"mode": "prompt", "question": "Go", "passages": ["x"], "join": 5},
    ]
    for r in reqs:
        r["params"] = SamplingParams(max_new_tokens=40)
    assert engine.windows.count(16) == 3
    alone = [_alone(engine, r) for r in reqs]
    la, ta, widest = _together(engine, reqs, max_batch=8)
    assert widest >= 3
    for i, r in enumerate(reqs):
        _compare(alone[i], (la[i], ta[i]), f"request {i} ({r['mode']})")


def test_sampling_parameters_stay_per_request(tmp_path):
    """A seeded sampled request decodes the same tokens batched as alone, next to a greedy one."""
    engine = _engine("llama", tmp_path)
    reqs = [
        {"mode": "turbo", "question": "Q1?", "passages": ["amber basalt."], "join": 0,
         "params": SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.9, seed=7)},
        {"mode": "full", "question": "Q2?", "passages": ["cobalt delta."], "join": 0,
         "params": SamplingParams(max_new_tokens=12)},
    ]  # fmt: skip
    alone = [_alone(engine, r)[1] for r in reqs]
    _, together, _ = _together(engine, reqs, max_batch=2)
    assert together == alone
