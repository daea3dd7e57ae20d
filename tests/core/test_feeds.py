"""Batched prefill is exact: the prefill forwards of several requests run together (core/feeds.py) give
each request the logits, and leave it the cache, of its own forward.

Random requests on tiny Llama, Qwen2 and Gemma 3 in fp32: turbo, turbo-composite and turbo-epic contexts of
different lengths and positions, full prompts chunked so that their later forwards share a batch, plain
prompts hitting the prefix cache, with and without the abstention reply (several kept logits), contexts
and questions that cross Gemma's 16-token sliding window. Compared: the first-token logits and those of
every later greedy decode step on the cache the batched forward left (within 1e-4).
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import char_tokenizer, make

from turborag.core.engine import Engine
from turborag.core.feeds import Feed, feed_together, together
from turborag.core.generate import SamplingParams
from turborag.core.model import LoadedModel, fingerprint
from turborag.core.options import EngineOptions
from turborag.store.kv_store import KVStore

WORDS = "amber basalt cobalt delta ember fjord garnet harbor indigo jasper kelp lumen".split()
TOL = 1e-4


def _engine(kind: str, tmp_path, threshold: float | None = None) -> Engine:
    model, tok = make(kind), char_tokenizer()
    lm = LoadedModel(model, tok, f"tiny-{kind}", fingerprint(model, tok), torch.device("cpu"), torch.float32)
    lm.abstain_threshold = threshold
    engine = Engine(lm, KVStore(tmp_path / kind, cache_format="float32"), EngineOptions(prefill_step=24))
    engine.stop_ids = set()
    return engine


def _requests(rng: random.Random, n: int) -> list[dict]:
    out = []
    for i in range(n):
        passages = [
            " ".join(rng.choices(WORDS, k=rng.randint(2, 14))) + "." for _ in range(rng.randint(1, 4))
        ]
        question = "Which word " + " ".join(rng.choices(WORDS, k=rng.randint(0, 6))) + f" comes {i}?"
        mode = rng.choice(["full", "turbo", "turbo-composite", "turbo-epic", "prompt"])
        out.append({"mode": mode, "question": question, "passages": passages})
    return out


PARAMS = SamplingParams(max_new_tokens=4)


def _steps(engine: Engine, r: dict):
    if r["mode"] == "prompt":
        ids = engine.lm.tokenizer(" ".join(r["passages"]) + r["question"])["input_ids"]
        return engine.begin_prompt_steps(ids, PARAMS, defer=True)
    return engine.begin_steps(r["question"], r["passages"], r["mode"], PARAMS, defer=True)


def _decode(engine: Engine, seq) -> torch.Tensor:
    out = [seq.logits.clone()]
    while True:
        seq.advance()
        if seq.finished:
            return torch.stack(out)
        engine.step(seq)
        out.append(seq.logits.clone())


def _run(engine: Engine, reqs: list[dict], batched: bool) -> tuple[list[torch.Tensor], int]:
    """Every request prefilled: each round takes the pending feed of every request; the ones that may
    share a forward run together (batched) or one by one. Returns per request its logits through decoding,
    and the most feeds run in one forward."""
    gens = [_steps(engine, r) for r in reqs]
    pending: dict[int, Feed] = {i: next(g) for i, g in enumerate(gens)}
    seqs: dict[int, object] = {}
    widest = 0
    while pending:
        group = [i for i, f in pending.items() if together(f)] if batched else []
        if len(group) < 2:
            group = [next(iter(pending))]
        results = feed_together([pending[i] for i in group], engine.windows)
        widest = max(widest, len(group))
        for i, logits in zip(group, results):
            try:
                pending[i] = gens[i].send(logits)
            except StopIteration as done:
                seqs[i] = done.value
                del pending[i]
    return [_decode(engine, seqs[i]) for i in range(len(reqs))], widest


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("threshold", [None, 0.99])
def test_feeds_together_equal_each_alone(kind, seed, threshold, tmp_path):
    engine = _engine(kind, tmp_path, threshold)
    reqs = _requests(random.Random(seed), 6)
    alone, _ = _run(engine, reqs, batched=False)
    together_, widest = _run(engine, reqs, batched=True)
    assert widest >= 3  # feeds really shared forwards
    for i, (a, b) in enumerate(zip(alone, together_)):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() < TOL, f"{kind} request {i} ({reqs[i]['mode']})"


def test_an_ape_feed_or_an_empty_cache_runs_alone(gemma_lm, tmp_path):
    engine = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"))
    ape = next(engine.begin_steps("Which word?", ["amber basalt."], "turbo-ape", PARAMS, defer=True))
    full = next(engine.begin_steps("Which word?", ["amber basalt."], "full", PARAMS, defer=True))
    turbo = next(engine.begin_steps("Which word?", ["amber basalt."], "turbo", PARAMS, defer=True))
    assert not together(ape) and not together(full) and together(turbo)
    with pytest.raises(ValueError, match="runs alone"):
        feed_together([turbo, ape], engine.windows)
