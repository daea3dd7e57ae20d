"""`turborag eval`: every question in every mode, accuracy and TTFT side by side.

Retrieval is held fixed (the paper's setting): each DATA line brings its passages in order, so the modes
differ only in cache reuse. The passages' caches are precomputed first (offline work, not timed) and reused
across modes and runs. Modes are interleaved per question, so machine noise hits every mode alike.

Bad lines (not JSON, no `question`, no `answers`, empty `contexts`) are reported with their line number and
skipped; a file with no usable line is an error.

A line may say `"answerable": false`: no passage answers its question, and it counts as correct exactly
when the model abstains (`metrics.abstains`).  The abstention rates are reported beside accuracy, since a
model that always abstains would otherwise look perfect on such questions and a model that never does
would look perfect on the others.

`scoring="rgb"` scores as the RGB benchmark does (`metrics.rgb_contains`: a lower-cased substring of any
alternative; a decline is RGB's "insufficient information" or ours), so a number can be set beside RGB's
published ones; each prediction record carries both verdicts (`correct` and `correct_rgb`).
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from turborag.core import grounding
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.modes import check_mode
from turborag.core.progress import progress_bar
from turborag.eval.metrics import SCORINGS, abstains, contains_answer, exact_match, rgb_contains, rgb_declines

log = logging.getLogger(__name__)


@dataclass
class Example:
    question: str
    answers: list[str]
    contexts: list[str]
    line: int
    answerable: bool = True  # False: no passage answers it, and the right answer is to abstain


def load_examples(path: str | Path, limit: int | None = None) -> tuple[list[Example], list[str]]:
    """Parse DATA.jsonl; returns (examples, problems), each problem naming its line."""
    examples, problems = [], []
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                problems.append(f"line {n}: not valid JSON ({e.msg})")
                continue
            problem = _check(obj)
            if problem:
                problems.append(f"line {n}: {problem}")
                continue
            examples.append(
                Example(
                    obj["question"],
                    list(obj["answers"]),
                    list(obj["contexts"]),
                    n,
                    obj.get("answerable", True),
                )
            )
            if limit is not None and len(examples) >= limit:
                break
    return examples, problems


def _check(obj) -> str | None:
    if not isinstance(obj, dict):
        return "not a JSON object"
    if not isinstance(obj.get("question"), str) or not obj["question"].strip():
        return "missing or empty 'question'"
    answers = obj.get("answers")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        return "'answers' must be a non-empty list of strings"
    contexts = obj.get("contexts")
    if not isinstance(contexts, list) or not contexts:
        return "'contexts' must be a non-empty list"
    if not all(isinstance(c, str) and c.strip() for c in contexts):
        return "every context must be a non-empty string"
    if not isinstance(obj.get("answerable", True), bool):
        return "'answerable' must be true or false"
    return None


@dataclass
class ModeResult:
    n: int
    accuracy: float
    exact_match: float
    ttft_s_mean: float
    ttft_s_p50: float
    # On the unanswerable examples: the fraction that abstained (None when there are none).
    abstain_rate: float | None = None
    # On the answerable examples: the fraction that abstained wrongly (None when there are none).
    false_abstain_rate: float | None = None
    # Per example, in the file's order: right or not (for paired comparisons between modes; not in --json).
    correct: list[bool] = field(default_factory=list, repr=False)


def _score(prediction: str, ex: Example, scoring: str = "ours") -> tuple[bool, bool, bool]:
    """(correct, exact match, abstained): an unanswerable example is correct iff the model abstains."""
    if scoring == "rgb":
        abstained = rgb_declines(prediction)
        hit = rgb_contains(prediction, ex.answers) if ex.answerable else abstained
    else:
        abstained = abstains(prediction)
        hit = contains_answer(prediction, ex.answers) if ex.answerable else abstained
    return hit, exact_match(prediction, ex.answers), abstained


def _rate(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def run_eval(
    engine: Engine,
    examples: Sequence[Example],
    modes: Sequence[str],
    max_new_tokens: int = 32,
    progress: bool = True,
    predictions: list[dict] | None = None,
    scoring: str = "ours",
) -> dict[str, ModeResult]:
    """Answer every example in every mode; if `predictions` is a list, one record per answer is appended.
    `scoring` is "ours" (`contains_answer`) or "rgb" (`rgb_contains`)."""
    if scoring not in SCORINGS:
        raise ValueError(f"unknown scoring {scoring!r}: use {' or '.join(SCORINGS)}")
    for m in modes:
        check_mode(m)
    passages = [c for ex in examples for c in ex.contexts]
    with progress_bar("precompute (offline, untimed)", unit="tok", enabled=progress) as bar:
        engine.precompute(passages, on_batch=bar.update)
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_at_newline=True)
    # Warm-up: the first forward pays one-off costs (allocator, kernels) that belong to no mode.
    engine.answer(examples[0].question, examples[0].contexts, modes[0], SamplingParams(max_new_tokens=1))

    scores: dict[str, list[tuple[bool, bool, float, bool, bool]]] = {m: [] for m in modes}
    for ex in progress_bar("eval", unit="q", enabled=progress, iterable=examples):
        for m in modes:
            a = engine.answer(ex.question, ex.contexts, m, params)
            hit, em, abstained = _score(a.text, ex, scoring)
            scores[m].append((hit, em, a.ttft_s, abstained, ex.answerable))
            if predictions is not None:
                record = {
                    "line": ex.line,
                    "mode": m,
                    "model": engine.lm.name,
                    "answer": a.text,
                    "gold": ex.answers,
                    "correct": hit,
                    "correct_rgb": _score(a.text, ex, "rgb")[0],
                    "scoring": scoring,
                    "ttft_s": a.ttft_s,
                }
                if not ex.answerable:
                    record["answerable"] = False
                if a.abstain_logprob is not None:  # scored for the abstention threshold
                    record["abstain_logprob"] = a.abstain_logprob
                # what the name check finds, whether or not the engine applied it (the experiment
                # turborag_research/experiments/threshold_table.py reads it)
                if missing := grounding.missing_names(ex.question, ex.contexts):
                    record["missing_names"] = missing
                predictions.append(record)
    return {m: _summary(rows) for m, rows in scores.items()}


def _summary(rows: list[tuple[bool, bool, float, bool, bool]]) -> ModeResult:
    """One mode's rows (correct, exact match, TTFT, abstained, answerable) as a ModeResult."""
    ttfts = [r[2] for r in rows]
    return ModeResult(
        n=len(rows),
        accuracy=sum(r[0] for r in rows) / len(rows),
        exact_match=sum(r[1] for r in rows) / len(rows),
        ttft_s_mean=statistics.fmean(ttfts),
        ttft_s_p50=statistics.median(ttfts),
        abstain_rate=_rate([r[3] for r in rows if not r[4]]),
        false_abstain_rate=_rate([r[3] for r in rows if r[4]]),
        correct=[r[0] for r in rows],
    )
