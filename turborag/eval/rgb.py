"""RGB's English questions as `turborag eval` files, built from RGB's own `data/en.json`.

RGB (Chen et al., "Benchmarking Large Language Models in Retrieval-Augmented Generation", AAAI 2024,
github.com/chen700564/RGB) is licensed CC BY-NC-SA 4.0, so its text is never shipped or committed here: a
user downloads `en.json` and this module turns it into the files `turborag eval` and `turborag gate` read.
They are for measurement only; nothing is ever trained or tuned on them.

`en.json` holds one JSON object a line: `id`, `query`, `answer`, `positive` (passages that answer the
question) and `negative` (passages on the same topic that do not). The passages of each question are chosen
as RGB's evalue.py chooses them (`sample`), so a number measured here can be set beside RGB's.

Files written (`build`), one record a line, lines of a question aligned across the answerable files:

    en5.jsonl            5 passages at noise 0.4: 3 positives + 2 negatives
    en5_noise08.jsonl    5 passages at noise 0.8: 1 positive + 4 negatives
    en_none.jsonl        5 negatives only, `"answerable": false`: right iff the model declines
    *_qshuf.jsonl        the same passages, shuffled per question

The `_qshuf` variants exist because RGB reseeds its shuffle with the same seed for every question, so every
5-passage question gets the same permutation: at noise 0.4 the positives always sit in slots 0, 3 and 4, at
noise 0.8 the one positive is always last, next to the question. A model can do well by position alone;
the per-question shuffle shows whether it does.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RGB_SEED = 2333  # evalue.py seeds `random` with this before each question's shuffle
PASSAGE_NUM = 5  # evalue.py's --passage_num default, the setting of the RGB and TurboRAG papers
# The target of an unanswerable line. Scoring ignores it (an unanswerable line is right iff the model
# declines); this value keeps the built files identical to the reference files already measured on.
RGB_ABSTAIN = "__abstain__"
# File stem -> noise ratio. Noise 1.0 is negatives only (RGB's "noise rate 1", the rejection test).
NOISE = {"en5": 0.4, "en5_noise08": 0.8, "en_none": 1.0}
ORDERS = ("rgb", "question")


class RgbFormatError(ValueError):
    """A line of en.json that is not what RGB writes; the message names the line."""


@dataclass
class BuildReport:
    """What `build` wrote and what it left out, and why."""

    written: dict[str, int] = field(default_factory=dict)  # file name -> questions
    skipped_multipart: int = 0  # answers needing several independent parts (e.g. three laureates)
    skipped_leaking: int = 0  # left out of en_none: one of its negatives names the answer
    skipped_no_negatives: int = 0  # left out of en_none: RGB gives the question no negative


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """RGB's en.json (JSON lines: id, query, answer, positive, negative), checked line by line.

    Raises RgbFormatError naming the first bad line, so a truncated download or the wrong file is one
    clear message rather than a KeyError deep in the sampling."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                raise RgbFormatError(f"line {n}: not valid JSON ({e.msg})") from None
            problem = _check_row(obj)
            if problem:
                raise RgbFormatError(f"line {n}: {problem}")
            rows.append(
                {
                    "id": obj["id"],
                    "query": obj["query"],
                    "answer": obj["answer"],
                    "positive": list(obj["positive"]),
                    "negative": list(obj["negative"]),
                }
            )
    if not rows:
        raise RgbFormatError("no questions in the file")
    return rows


def _check_row(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return "not a JSON object"
    missing = [k for k in ("id", "query", "answer", "positive", "negative") if k not in obj]
    if missing:
        return f"missing {', '.join(missing)} (is this RGB's data/en.json?)"
    if not isinstance(obj["query"], str) or not obj["query"].strip():
        return "'query' must be a non-empty string"
    if not isinstance(obj["answer"], (str, list)) or not obj["answer"]:
        return "'answer' must be a string or a non-empty list"
    for key in ("positive", "negative"):
        if not isinstance(obj[key], list) or not all(isinstance(p, str) for p in obj[key]):
            return f"'{key}' must be a list of strings"
    return None


def sample(
    row: dict[str, Any], noise_rate: float, passage_num: int = PASSAGE_NUM, order: str = "rgb"
) -> list[str]:
    """The passages RGB's evalue.py gives one question, re-implemented so results compare with RGB's.

    neg = ceil(passage_num * noise_rate) negatives and pos = passage_num - neg positives. When RGB has
    fewer negatives than that, the rest are positives; otherwise, when it has fewer positives, the rest are
    negatives. The FIRST pos positives and FIRST neg negatives in RGB's order are taken, positives first,
    then shuffled. Noise 1.0 is the first passage_num negatives, with no fall-back.

    order "rgb" shuffles with a fresh random.seed(2333), as evalue.py does, so all questions with the same
    number of passages get the same permutation. order "question" shuffles the same passages with a seed
    of the question's own ("2333-<id>"), so the positives' slots vary from question to question."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    positives, negatives = row["positive"], row["negative"]
    if noise_rate >= 1:
        n_pos, n_neg = 0, passage_num
    else:
        n_neg = math.ceil(passage_num * noise_rate)
        n_pos = passage_num - n_neg
        if n_neg > len(negatives):
            n_neg = len(negatives)
            n_pos = passage_num - n_neg
        elif n_pos > len(positives):
            n_pos = len(positives)
            n_neg = passage_num - n_pos
    docs = positives[:n_pos] + negatives[:n_neg]
    seed = RGB_SEED if order == "rgb" else f"{RGB_SEED}-{row['id']}"
    random.Random(seed).shuffle(docs)  # the same stream as evalue.py's random.seed(2333); random.shuffle
    return docs


def flatten_answer(answer: str | list) -> list[str] | None:
    """RGB's answer as our list of alternatives (any one is right), or None when it cannot be one.

    RGB's answer is a list of PARTS that are all required; each part is a string or a list of alternative
    strings. A one-part answer becomes its alternatives. Several parts are kept only when one part implies
    the others -- each of its alternatives contains an alternative of every other part, as in
    ["Rafael Nadal", "Nadal"] -- because our scoring asks for one alternative, not for all parts."""
    parts = answer if isinstance(answer, list) else [answer]
    parts = [[str(a) for a in (p if isinstance(p, list) else [p])] for p in parts]
    chosen = parts[0] if len(parts) == 1 else next((p for p in parts if _implies(p, parts)), None)
    if chosen is None:
        return None
    out, seen = [], set()
    for a in chosen:  # drop blanks and case-insensitive repeats, keeping RGB's order
        if a.strip() and a.lower() not in seen:
            seen.add(a.lower())
            out.append(a)
    return out or None


def _implies(part: list[str], parts: list[list[str]]) -> bool:
    """Every alternative of `part` contains (case-insensitively) some alternative of every other part."""
    others = [q for q in parts if q is not part]
    return all(any(o.lower() in a.lower() for o in q) for q in others for a in part)


def _fold(text: str) -> str:
    """Lenient form for the leak check: accents stripped, lower case, punctuation dropped, spaces single."""
    decomposed = unicodedata.normalize("NFKD", text)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c)).lower()
    return " ".join(re.sub(r"[^\w\s]", "", plain).split())


def leaks(passage: str, answers: list[str]) -> bool:
    """True if the passage names one of the answers (leniently), so it is no true negative."""
    folded = _fold(passage)
    return any(_fold(a) and _fold(a) in folded for a in answers)


def records(
    rows: list[dict[str, Any]], noise_rate: float, order: str = "rgb", report: BuildReport | None = None
) -> list[dict[str, Any]]:
    """The `turborag eval` records of one file: {"question", "answers", ["answerable",] "contexts", "rgb_id"}.

    Questions whose answer cannot be flattened are left out of every file; at noise 1.0, questions where a
    negative names the answer are left out too, since declining would then be wrong. `report`, when given,
    counts what was left out."""
    report = report if report is not None else BuildReport()
    out = []
    for row in rows:
        answers = flatten_answer(row["answer"])
        if answers is None:
            report.skipped_multipart += 1
            continue
        docs = sample(row, noise_rate, order=order)
        if noise_rate >= 1:
            if not docs:
                report.skipped_no_negatives += 1
                continue
            if any(leaks(d, answers) for d in docs):
                report.skipped_leaking += 1
                continue
            rec = {"question": row["query"], "answers": [RGB_ABSTAIN], "answerable": False}
        else:
            rec = {"question": row["query"], "answers": answers}
        rec["contexts"] = docs
        rec["rgb_id"] = row["id"]
        out.append(rec)
    return out


def build(rows: list[dict[str, Any]], out_dir: str | Path) -> BuildReport:
    """Write en5, en5_noise08, en_none and their _qshuf variants under out_dir.

    Each file is written to NAME.part and renamed, so an interrupted build never leaves a half file that
    `turborag gate` would take for a whole one. The report's skip counts are per question, not summed
    over files."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = BuildReport()
    for stem, noise in NOISE.items():
        for order in ORDERS:
            # en_none in RGB order meets every kind of skip once per question; the other passes would
            # only count the same multi-part questions again.
            counting = report if noise >= 1 and order == "rgb" else None
            recs = records(rows, noise, order=order, report=counting)
            name = stem + ("_qshuf" if order == "question" else "") + ".jsonl"
            _write_jsonl(out_dir / name, recs)
            report.written[name] = len(recs)
    return report


def _write_jsonl(path: Path, recs: list[dict[str, Any]]) -> None:
    part = path.with_name(path.name + ".part")
    with open(part, "w", encoding="utf-8") as f:
        for rec in recs:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(part, path)
