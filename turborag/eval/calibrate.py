"""`turborag calibrate`: choose the training-free mode, and its settings, for a model nobody tuned.

On a model without a cache-aware fine-tune, plain turbo loses accuracy, and which training-free repair wins
it back best (epic's or blend's recompute, APE's temperature and scale, or a mix) depends on the model and
on the user's text: measured, not assumed. Calibration answers the user's own validation questions in
`full` and in every candidate, picks the candidate with the best accuracy (a tie goes to the cheaper one,
the earlier in CANDIDATES), and records the choice next to the model (turborag_calibration.json, beside the
weights or the adapter, as a fine-tune records its threshold). `--mode auto` then answers in that mode with
those settings (core/engine.py), and says so when it stays more than 3 points below `full`.

Given unanswerable questions as well (`--unanswerable`: the user's own, such as topical twins of the
validation questions), calibration also chooses an abstention threshold. An instruct model told to reply
"The passages do not say." when the passages lack the answer rarely does so greedily, yet the probability
it gives that reply can still tell the two kinds of question apart. The threshold chosen is the one that
declines the most unanswerable questions in the chosen mode while forcing the reply on no more than
`max_false_abstain` of the answerable ones, in that mode and in `full` alike; it is recorded as
`abstain_threshold` and the engine then answers the reply whenever its probability reaches it.

The data must not be an evaluation benchmark: a file whose records carry RGB's ids is refused, since a
mode chosen on RGB would make RGB's numbers measure the choice, not the model.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from turborag.core import modes
from turborag.core.defaults import CALIBRATION_WITHIN
from turborag.core.engine import Engine
from turborag.core.files import write_json
from turborag.core.generate import SamplingParams
from turborag.core.model import CALIBRATION_FILE
from turborag.core.options import TRAINING_FREE_DEFAULTS
from turborag.core.progress import progress_bar
from turborag.eval.evaluate import Example, ModeResult, run_eval


@dataclass(frozen=True)
class Candidate:
    mode: str
    settings: dict = field(default_factory=dict)  # Engine keywords (TRAINING_FREE_DEFAULTS' names)

    @property
    def label(self) -> str:
        extra = ",".join(f"{k.split('_')[-1]}={v}" for k, v in self.settings.items())
        return f"{self.mode}({extra})" if extra else self.mode


# Cheapest first (a tie in accuracy goes to the earlier): turbo and APE cost the same, epic recomputes
# 16 tokens a chunk, blend 15% of the passages plus a two-layer prefill to choose them. APE three ways: the
# paper's defaults (tuned on 7-9B models), its temperature alone (scale 1/T keeps the passages' share,
# exp(S*T*LSE), unchanged) and its scaling alone, since which part helps a given model is for its own
# questions to say.
CANDIDATES = (
    Candidate("turbo"),
    Candidate("turbo-ape", {"ape_temperature": 0.9, "ape_scale": 0.9}),
    Candidate("turbo-ape", {"ape_temperature": 0.9, "ape_scale": round(1 / 0.9, 4)}),
    Candidate("turbo-ape", {"ape_temperature": 1.0, "ape_scale": 0.9}),
    Candidate("turbo-epic"),
    Candidate("turbo-ape-epic", {"ape_temperature": 0.9, "ape_scale": 0.9}),
    Candidate("turbo-blend"),
)


def check_not_a_benchmark(path: Path) -> None:
    """Refuse RGB's files (their records carry `rgb_id`): it measures, it never chooses."""
    with path.open(encoding="utf-8") as f:
        if any('"rgb_id"' in line for line in f):
            raise ValueError(
                f"{path} is RGB, an evaluation benchmark: calibrating on it would make its numbers "
                "measure the choice. Calibrate on your own questions (or `turborag data synth`), then "
                "evaluate on RGB"
            )


def calibrate(
    engine: Engine,
    examples: Sequence[Example],
    candidates: Sequence[Candidate] = CANDIDATES,
    max_new_tokens: int = 32,
    progress: bool = True,
    say: Callable[[str], None] = lambda _: None,
) -> dict:
    """Answer `examples` in full and in every candidate; the record of the best candidate (see module)."""
    say(f"full: {len(examples)} questions")
    full = run_eval(engine, examples, ["full"], max_new_tokens, progress=progress)["full"]
    measured: list[tuple[Candidate, ModeResult]] = []
    for c in candidates:
        say(f"{c.label}: {len(examples)} questions")
        got = run_eval(candidate(engine, c.settings), examples, [c.mode], max_new_tokens, progress=progress)
        measured.append((c, got[c.mode]))
    best, result = max(measured, key=lambda cr: cr[1].accuracy)  # max keeps the first of equals
    turbo = next((r for c, r in measured if c.mode == "turbo" and not c.settings), None)
    return {
        "mode": best.mode,
        "settings": best.settings,
        "label": best.label,
        "accuracy": result.accuracy,
        "full_accuracy": full.accuracy,
        "within_3_points": full.accuracy - result.accuracy <= CALIBRATION_WITHIN,
        "ttft_s_p50": result.ttft_s_p50,
        "full_ttft_s_p50": full.ttft_s_p50,
        "turbo_ttft_s_p50": turbo.ttft_s_p50 if turbo else None,
        "n": len(examples),
        "model": engine.lm.name,
        "dtype": str(engine.lm.dtype).removeprefix("torch."),
        "date": datetime.date.today().isoformat(),
        "candidates": [
            {"label": c.label, "accuracy": r.accuracy, "ttft_s_p50": r.ttft_s_p50} for c, r in measured
        ],
    }


# Thresholds tried, most conservative first: a tie in abstention goes to the higher one.
THRESHOLDS = (0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03, 0.02, 0.01)


def abstain_scores(
    engine: Engine, examples: Sequence[Example], mode: str, progress: bool = True
) -> list[float]:
    """log p(ABSTAIN | prompt) of each example in `mode`, as the engine scores it for its threshold (the
    reply teacher-forced in the prefill forward; threshold 1, which no probability reaches, never forces
    it)."""
    scoring = engine.with_options(abstain_threshold=1.0)
    if modes.get(mode).reuses_caches:  # `full` prefills its passages: no chunk caches to make
        with progress_bar("precompute (offline, untimed)", unit="tok", enabled=progress) as bar:
            scoring.precompute([c for e in examples for c in e.contexts], on_batch=bar.update)
    one = SamplingParams(max_new_tokens=1)
    rows = progress_bar(f"abstention scores ({mode})", unit="q", enabled=progress, iterable=examples)
    return [scoring.answer(e.question, e.contexts, mode, one).abstain_logprob for e in rows]


def choose_threshold(
    answerable: dict[str, list[float]],
    unanswerable: dict[str, list[float]],
    mode: str,
    max_false_abstain: float = 0.0,
    thresholds: Sequence[float] = THRESHOLDS,
) -> dict:
    """The threshold that declines the most of `unanswerable` in `mode` while forcing the reply on at most
    `max_false_abstain` of `answerable` in every mode scored (the scores are log-probabilities, by mode).
    `threshold` is None when no threshold declines anything within that bound."""

    def rate(scores: list[float], t: float) -> float:
        return sum(x >= math.log(t) for x in scores) / len(scores)

    rows = [
        {
            "threshold": t,
            "abstain": {m: rate(unanswerable[m], t) for m in unanswerable},
            "false_abstain": {m: rate(answerable[m], t) for m in answerable},
        }
        for t in thresholds
    ]
    allowed = [r for r in rows if max(r["false_abstain"].values()) <= max_false_abstain]
    best = max(allowed, key=lambda r: r["abstain"][mode], default=None)  # max keeps the first of equals
    chosen = best["threshold"] if best is not None and best["abstain"][mode] > 0 else None
    return {
        "threshold": chosen,
        "mode": mode,
        "max_false_abstain": max_false_abstain,
        "n_answerable": len(answerable[mode]),
        "n_unanswerable": len(unanswerable[mode]),
        "thresholds": rows,
    }


def calibrate_abstention(
    engine: Engine,
    answerable: Sequence[Example],
    unanswerable: Sequence[Example],
    mode: str,
    max_false_abstain: float = 0.0,
    progress: bool = True,
    say: Callable[[str], None] = lambda _: None,
) -> dict:
    """Score both sets in `mode` and in `full`, and choose the threshold (`choose_threshold`)."""
    if not answerable or not unanswerable:
        raise ValueError("choosing an abstention threshold needs answerable and unanswerable questions")
    a, u = {}, {}
    for m in dict.fromkeys((mode, "full")):
        say(f"abstention scores in {m}: {len(answerable)} answerable, {len(unanswerable)} unanswerable")
        a[m] = abstain_scores(engine, answerable, m, progress)
        u[m] = abstain_scores(engine, unanswerable, m, progress)
    return choose_threshold(a, u, mode, max_false_abstain)


def candidate(engine: Engine, settings: dict) -> Engine:
    """The engine with one candidate's training-free settings (sharing its model and caches)."""
    unknown = sorted(set(settings) - set(TRAINING_FREE_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]!r}: use {', '.join(TRAINING_FREE_DEFAULTS)}")
    return engine.with_options(**settings)


def write_record(folder: Path, record: dict) -> Path:
    """Write turborag_calibration.json into `folder` (atomically: a crash leaves the old one or none)."""
    path = folder / CALIBRATION_FILE
    write_json(path, record)
    return path
