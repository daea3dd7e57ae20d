"""The promotion gate: a model ships only if it is no worse than the one it replaces on every set.

A fine-tune trained on generated data learns the generator; a held-out split of the same templates cannot
see that, and neither can a single number that rises. So a candidate is compared with the current model on
every gate set in one run, question by question, in every mode (full and turbo): the external RAG
benchmark RGB (5 passages at noise 0.4 and 0.8, in RGB's fixed passage order and shuffled, and the set where
no passage answers), our synthetic questions whose template families training never saw, held-out stdlib
documentation in templated and in plain-English questions, unanswerable twins of ours that keep the passage
on the asked topic (the kind RGB's no-answer set asks) and the hand-written demo-corpus questions.  On each
set and mode the questions only one of the two got right are counted, and an exact sign test
(`metrics.paired_difference`) says whether the gap is more than that set's noise.  The gate fails when
the candidate is worse beyond noise (fewer questions right and p < alpha) anywhere.

The gate is a veto, not a selector: it rejects a model that regresses; nothing is ever tuned or picked by
its RGB numbers (which checkpoint to try is decided on our own data before the gate runs).

Answers are stored per model and set (`predictions_path`), so a model measured once is reused against every
other candidate, and a killed gate resumes where it stopped.  Each answer file has a key beside it
(`answers_key`: the questions asked, the modes, the adapter's files and how the model computed: device,
dtype and template), so a set that was rebuilt, an adapter replaced under the same name or a gate run in
another dtype answers again instead of comparing with answers computed otherwise: both sides of a gate are
always measured the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from turborag.core.model import adapter_digest, adapter_dir_for
from turborag.eval.evaluate import Example, load_examples, run_eval
from turborag.eval.gate_sets import ALPHA, GATE_MODES, GATE_SETS, GateSet, set_file
from turborag.eval.metrics import abstains, paired_difference, rgb_declines


def model_label(spec: str) -> str:
    """A folder name for a model: a named model as is, a path by its last two parts ("runs/ft/adapter" ->
    "ft-adapter"), so that two adapters called `adapter` do not share answers."""
    path = Path(spec)
    if len(path.parts) == 1:
        return spec
    return "-".join(path.parts[-2:]).replace(" ", "_")


def predictions_path(out: Path, label: str, name: str, limit: int | None) -> Path:
    """Where a model's answers on a set are kept: OUT/LABEL/SET.nLIMIT.pred.jsonl (`all` without a limit)."""
    return out / label / f"{name}.n{limit or 'all'}.pred.jsonl"


def computed_as(device: str = "cpu", dtype: str = "auto", template: str = "auto") -> str:
    """How a model computes its answers, as the answer key records it: the device type, the dtype `auto`
    resolves to on this machine (bf16 and fp32 answers differ in a few greedy tokens), and the template."""
    from turborag.core.model import dtype_name, resolve_device, resolve_dtype

    dev = resolve_device(device)
    return f"{dev.type} {dtype_name(resolve_dtype(dtype, dev))} template={template}"


def answers_key(
    spec: str, examples: Sequence[Example], modes: Sequence[str], computed: str | None = None
) -> str:
    """What a model's stored answers on a set were made from: the model (an adapter by the digests of its
    files, which carry its threshold and name check; any other model by its spec), the questions with their
    passages and gold answers, the modes, and how the model computed (`computed_as`).  A rebuilt set, a
    retrained adapter or another dtype gives another key."""
    h = hashlib.sha256()
    h.update(f"computed {computed or computed_as()}\n".encode())
    adapter = adapter_dir_for(spec)
    if adapter is None:
        h.update(f"model {spec}\n".encode())
    else:
        h.update(f"adapter {adapter_digest(adapter)}\n".encode())
    for e in examples:
        h.update(json.dumps([e.line, e.question, e.answers, e.contexts, e.answerable]).encode() + b"\n")
    h.update(json.dumps(list(modes)).encode())
    return h.hexdigest()


def _key_path(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".pred.jsonl") + ".key")


def stored(path: Path, key: str) -> bool:
    """Whether answers are stored at `path` for exactly this key."""
    key_file = _key_path(path)
    return path.exists() and key_file.exists() and key_file.read_text(encoding="utf-8").strip() == key


def read_predictions(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def answer_sets(
    engine,
    spec: str,
    files: dict[str, Path],
    out: Path,
    limit: int | None,
    modes: Sequence[str] = GATE_MODES,
    progress: bool = True,
    on_set: Callable[[str], None] | None = None,
    computed: str | None = None,
) -> dict[str, list[dict]]:
    """Every set's answers of one model in `modes`: read if stored under the same key, else answered and
    stored (written to a .partial file and renamed, then the key, so only a finished set counts)."""
    got = {}
    for name, file in files.items():
        path = predictions_path(out, model_label(spec), name, limit)
        examples, _ = load_examples(file, limit)
        key = answers_key(spec, examples, modes, computed)
        if not stored(path, key):
            if on_set:
                on_set(name)
            records: list[dict] = []
            tokens = GATE_SETS[name].max_new_tokens if name in GATE_SETS else 32
            run_eval(engine, examples, modes, tokens, progress=progress, predictions=records)
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            partial.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
            partial.replace(path)
            _key_path(path).write_text(key + "\n", encoding="utf-8")
        got[name] = read_predictions(path)
    return got


def needs_answers(
    spec: str,
    files: dict[str, Path],
    out: Path,
    limit: int | None,
    modes: Sequence[str] = GATE_MODES,
    computed: str | None = None,
) -> bool:
    """Whether some set's answers of this model are not stored (or stale), so the model must be loaded."""
    return any(
        not stored(
            predictions_path(out, model_label(spec), name, limit),
            answers_key(spec, load_examples(file, limit)[0], modes, computed),
        )
        for name, file in files.items()
    )


@dataclass
class GateRow:
    """One set and mode: both models' accuracy, declines, the paired counts and the verdict."""

    set: str
    mode: str
    n: int
    candidate: float  # accuracy
    current: float
    # answerable questions declined (false declines), or, on a set where nothing answers, questions declined
    candidate_declined: float
    current_declined: float
    only_candidate: int  # questions only the candidate got right
    only_current: int
    p: float
    verdict: str  # "worse" (fails the gate), "better", or "same" (within noise)


def declined(record: dict) -> bool:
    """Whether an answer declines, by the scoring it was scored with."""
    return rgb_declines(record["answer"]) if record.get("scoring") == "rgb" else abstains(record["answer"])


def compare(
    name: str, candidate: list[dict], current: list[dict], modes: Sequence[str], alpha: float = ALPHA
) -> list[GateRow]:
    """The rows of one set: the two models' answers paired by (mode, line)."""
    rows = []
    for mode in modes:
        a = {r["line"]: r for r in candidate if r["mode"] == mode}
        b = {r["line"]: r for r in current if r["mode"] == mode}
        if a.keys() != b.keys() or not a:
            raise ValueError(
                f"{name} ({mode}): the two models answered different questions ({len(a)} and {len(b)}); "
                "run both with the same --limit"
            )
        lines = sorted(a)
        ca, cb = [a[i]["correct"] for i in lines], [b[i]["correct"] for i in lines]
        only_a, only_b, p = paired_difference(ca, cb)
        verdict = "same"
        if p < alpha:
            verdict = "worse" if only_b > only_a else "better"
        unanswerable = all(a[i].get("answerable", True) is False for i in lines)
        counted = [i for i in lines if (a[i].get("answerable", True) is False) == unanswerable]
        rows.append(
            GateRow(
                name,
                mode,
                len(lines),
                sum(ca) / len(lines),
                sum(cb) / len(lines),
                sum(declined(a[i]) for i in counted) / len(counted),
                sum(declined(b[i]) for i in counted) / len(counted),
                only_a,
                only_b,
                p,
                verdict,
            )
        )
    return rows


def passed(rows: Sequence[GateRow]) -> bool:
    return not any(r.verdict == "worse" for r in rows)


def markdown(rows: Sequence[GateRow], candidate: str, current: str) -> str:
    """The gate's table, as BENCHMARKS and an adapter's README record it.  "declined" is the share of
    answerable questions declined (false declines), on a set where no passage answers the share declined."""
    head = (
        f"| set | mode | n | {candidate} | {current} | declined (cand. / cur.) | only cand. / only cur. "
        "right (p) | verdict |\n|---|---|---|---|---|---|---|---|"
    )
    body = [
        f"| {r.set} | {r.mode} | {r.n} | {r.candidate:.1%} | {r.current:.1%} | "
        f"{r.candidate_declined:.1%} / {r.current_declined:.1%} | {r.only_candidate} / {r.only_current} "
        f"({r.p:.2f}) | {r.verdict} |"
        for r in rows
    ]
    return "\n".join([head, *body])


def as_json(rows: Sequence[GateRow], candidate: str, current: str) -> dict:
    return {
        "candidate": candidate,
        "current": current,
        "passed": passed(rows),
        "rows": [asdict(r) for r in rows],
    }


__all__ = [
    "ALPHA",
    "GATE_MODES",
    "GATE_SETS",
    "GateRow",
    "GateSet",
    "answer_sets",
    "answers_key",
    "computed_as",
    "as_json",
    "compare",
    "declined",
    "markdown",
    "model_label",
    "needs_answers",
    "passed",
    "predictions_path",
    "set_file",
    "stored",
]
