"""`turborag bench ttft` on a tiny model: every mode answers once, untimed, before the first measurement, and
the progress lines are text, not dataclass reprs."""

from __future__ import annotations

import json
import statistics

import torch
from conftest import char_tokenizer, make
from typer.testing import CliRunner

from turborag.bench import engine as bench_engine
from turborag.bench.engine import QUESTION, bench_ttft
from turborag.cli import app
from turborag.core import engine as core_engine
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.model import LoadedModel, fingerprint
from turborag.store.kv_store import KVStore

runner = CliRunner()


def _engine(tmp_path) -> Engine:
    model, tok = make("gemma3"), char_tokenizer()
    lm = LoadedModel(model, tok, "tiny", fingerprint(model, tok), torch.device("cpu"), torch.float32)
    return Engine(lm, KVStore(tmp_path, cache_format="float32"))


def test_each_mode_is_warmed_up_before_it_is_timed(tmp_path, monkeypatch):
    engine = _engine(tmp_path)
    calls: list[tuple[str, float]] = []  # (mode, ttft) of every answer to the benchmark's question
    answer = engine.answer

    def counting(question, passages, mode, *args, **kwargs):
        a = answer(question, passages, mode, *args, **kwargs)
        if question == QUESTION:
            calls.append((mode, a.ttft_s))
        return a

    monkeypatch.setattr(engine, "answer", counting)
    floors: list[float] = []
    floor = bench_engine.floor_ttft

    def counting_floor(*args):
        floors.append(floor(*args))
        return floors[-1]

    monkeypatch.setattr(bench_engine, "floor_ttft", counting_floor)
    lines = []
    rows = bench_ttft(engine, [64, 128], repeats=1, chunk_tokens=32, log=lines.append, samples=1)

    # one untimed call per mode at the first size, then one timed call per mode and size
    assert [m for m, _ in calls] == ["full", "turbo", "full", "turbo", "full", "turbo"]
    assert rows[0].full_ttft_s == calls[2][1] and rows[0].turbo_ttft_s == calls[3][1]  # not calls 0 and 1
    assert len(floors) == 3 and rows[0].floor_ttft_s == floors[1]
    assert lines == [r.summary() for r in rows] and all(isinstance(line, str) for line in lines)
    assert lines[0].startswith("64 context tokens: full ")


def test_turbo_and_the_floor_are_measured_in_pairs_several_times_a_repeat(tmp_path, monkeypatch):
    """Full once per repeat, first or last by turns; turbo then floor, `samples` pairs per repeat; each
    reported TTFT is the median of its mode's measurements."""
    engine = _engine(tmp_path)
    order: list[tuple[str, float]] = []
    answer, floor = engine.answer, bench_engine.floor_ttft

    def counting(question, passages, mode, *args, **kwargs):
        a = answer(question, passages, mode, *args, **kwargs)
        if question == QUESTION:
            order.append((mode, a.ttft_s))
        return a

    def counting_floor(*args):
        order.append(("floor", floor(*args)))
        return order[-1][1]

    monkeypatch.setattr(engine, "answer", counting)
    monkeypatch.setattr(bench_engine, "floor_ttft", counting_floor)
    [row] = bench_ttft(engine, [64], repeats=2, chunk_tokens=32, log=lambda line: None, samples=3)
    timed = order[3:]  # after the warm-up: full, turbo, floor
    pairs = ["turbo", "floor"] * 3
    assert [m for m, _ in timed] == ["full", *pairs, *pairs, "full"]
    for mode, got in (("full", row.full_ttft_s), ("turbo", row.turbo_ttft_s), ("floor", row.floor_ttft_s)):
        assert got == statistics.median(t for m, t in timed if m == mode)


def test_cli_prints_progress_lines_not_reprs(tiny_model_dir, env):
    args = ["bench", "ttft", "--model", tiny_model_dir, "--repeats", "1", "--chunk-tokens", "32"]
    r = runner.invoke(app, [*args, "--context-tokens", "64,128"])
    assert r.exit_code == 0, r.output
    assert "TTFTRow(" not in r.stderr and "TTFTRow(" not in r.stdout
    assert "64 context tokens: full " in r.stderr and "128 context tokens: full " in r.stderr
    assert "speedup" in r.stdout  # the table


def test_the_floor_does_the_model_work_turbo_does(tmp_path, monkeypatch):
    """With an abstention threshold the floor feeds the question and the scored reply in one forward, the
    tokens turbo's question prefill feeds, so turbo / floor measures loading alone; without one, the
    question alone. The logits of the question's last token are the same either way."""
    engine = _engine(tmp_path)
    passages = ["Odrun Pask rings the bell.", "The harbour of Velmora has boats."]
    engine.precompute(passages)
    fed: list[list[int]] = []
    feed_steps = engine._feed_steps

    def spy(cache, ids, *args, **kwargs):
        fed.append(list(ids))
        return (yield from feed_steps(cache, ids, *args, **kwargs))

    monkeypatch.setattr(engine, "_feed_steps", spy)
    scored: list[int] = []  # the reply's log-probability read off the logits: turbo and the floor alike
    logprob = core_engine.reply_logprob
    monkeypatch.setattr(core_engine, "reply_logprob", lambda *a: scored.append(1) or logprob(*a))
    for threshold in (0, 0.5):  # 0: no threshold
        variant = engine.with_options(abstain_threshold=threshold)
        fed.clear()
        variant.answer(QUESTION, passages, "turbo", SamplingParams(max_new_tokens=1))
        turbo, turbo_scored = fed[0], len(scored)
        fed.clear()
        scored.clear()
        bench_engine.floor_ttft(variant, QUESTION, passages)
        assert fed == [turbo] and len(scored) == turbo_scored == (1 if threshold else 0)
        scored.clear()
        suffix = engine.layout.suffix_ids(QUESTION)
        assert turbo == (suffix + engine.abstain_ids[:-1] if threshold else suffix)
    prompt = engine.layout.build(QUESTION, passages)
    logits = []
    for scored in (False, True):
        ctx = engine.assemble(prompt, "turbo", len(prompt.suffix) + 40)
        cache, next_pos = ctx.cache, ctx.next_pos
        logits.append(engine.prefill_question(cache, prompt, next_pos, scored=scored))
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=0)


def test_cli_reads_turbo_from_the_ram_tier_when_asked(tiny_model_dir, env, monkeypatch):
    """`--ram-cache-bytes` puts the RAM tier that `serve` holds in front of the bench store: after the
    warm-up, turbo's reads are RAM-tier hits, and the JSON records the budget."""
    from turborag.store.tiered import TieredStore

    tiers: list[TieredStore] = []
    init = TieredStore.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        tiers.append(self)

    monkeypatch.setattr(TieredStore, "__init__", spy)
    args = ["bench", "ttft", "--model", tiny_model_dir, "--repeats", "1", "--chunk-tokens", "32", "--json"]
    r = runner.invoke(app, [*args, "--context-tokens", "64", "--ram-cache-bytes", "64M"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["ram_cache_bytes"] == 64 << 20
    assert tiers[-1].ram.max_bytes == 64 << 20 and tiers[-1].ram.stats.hits > 0
    bad = runner.invoke(app, [*args, "--context-tokens", "64", "--ram-cache-bytes", "lots"])
    assert bad.exit_code == 2 and "--ram-cache-bytes" in bad.stderr
