"""Every held-out set of the cache-aware fine-tune for one model, in one command, and one table at the end.

A candidate adapter is judged on eight sets (docs/BENCHMARKS.md): synthetic facts from the held-out domains
with 5 and 16 passages, stdlib questions of the eval split in documentation layout, their near-namesake
unanswerable set, the plain-English questions and their twins without the answering passage, and the
hand-written demo-corpus sets; `realtext-doc-450` is the stdlib set at three times the size, for gaps of about
a point that 150 questions cannot resolve (not in the default --sets). Each is a separate `turborag eval` of
several minutes to an hour on a 2-core CPU, so a session that runs them by hand loses track; this runner
builds any set that is missing (the same commands and seeds as BENCHMARKS), runs the evals one after the other
(timings from two evals at once are worthless), and skips an eval whose predictions already exist, so a killed
run resumes where it stopped.

Every eval runs with `--abstain-threshold 1 --no-name-check`: each answer is the greedy one and carries the
probability of the abstention reply and the names of its question that no passage mentions, so the closing
table gives the greedy results, those at `--threshold` (default: the one the shipped adapter records), and
those at the threshold with the engine's name check (the shipped adapter turns it on) without decoding again.

    python -m turborag_research.experiments.heldout_evals --model ft6/adapter --out runs/ft6-evals
    python -m turborag_research.experiments.heldout_evals --model gemma-3-270m-turbo --out runs/shipped \\
        --sets held16,realtext-doc
    python -m turborag_research.experiments.heldout_evals --model ft7/adapter --out runs/ft7-turbo \\
        --modes turbo
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from turborag.core.defaults import DEFAULT_MODEL
from turborag.core.model import abstain_threshold, adapter_dir_for
from turborag_research.experiments.threshold_table import read_groups, table

# name: (file in the eval folder, modes, max new tokens)
SETS: dict[str, tuple[str, str, int]] = {
    "held5": ("held5.jsonl", "full,turbo", 32),
    "held16": ("held16.jsonl", "full,turbo", 32),
    "realtext-doc": ("realtext-doc-eval.jsonl", "full,turbo", 48),
    "realtext-doc-450": ("realtext-doc-450.jsonl", "full,turbo", 48),
    "unanswerable-doc": ("unanswerable-doc-eval.jsonl", "turbo,full", 48),
    "prose-doc": ("prose-doc-eval.jsonl", "turbo,full", 48),
    "prose-unanswerable-doc": ("prose-unanswerable-doc-eval.jsonl", "turbo,full", 48),
    "langref": ("langref-eval.jsonl", "turbo,full", 48),
    "langref-names": ("langref-names-eval.jsonl", "turbo,full", 48),
}


def turborag(*args: str) -> list[str]:
    return [sys.executable, "-m", "turborag", *args]


def build_sets(eval_dir: Path, names: list[str]) -> None:
    """Write the missing held-out files: `data mix --eval-dir` (seed 0), `data synth` (seeds 21 and 22),
    and the demo-corpus set from the demo store (`turborag demo` makes it)."""
    eval_dir.mkdir(parents=True, exist_ok=True)
    missing = {n for n in names if not (eval_dir / SETS[n][0]).exists()}
    if missing & {"realtext-doc", "unanswerable-doc", "prose-doc", "prose-unanswerable-doc"}:
        scratch = eval_dir / ".mix-scratch.jsonl"
        mix = ("data", "mix", "--n", "1", "--seed", "0", "--out", str(scratch), "--eval-dir", str(eval_dir))
        subprocess.run(turborag(*mix), check=True)
        scratch.unlink()
    if "realtext-doc-450" in missing:  # the real-text set at three times the size, for gaps of a point
        big = eval_dir / ".eval-450"
        mix = ("data", "mix", "--n", "1", "--seed", "0", "--out", str(big / "scratch.jsonl"), "--eval-dir",
               str(big), "--eval-n", "450")  # fmt: skip
        subprocess.run(turborag(*mix), check=True)
        (big / "realtext-doc-eval.jsonl").rename(eval_dir / SETS["realtext-doc-450"][0])
        shutil.rmtree(big)
    for name, contexts, seed in (("held5", 5, 21), ("held16", 16, 22)):
        if name in missing:
            out = eval_dir / SETS[name][0]
            subprocess.run(
                turborag("data", "synth", "--n", "150", "--contexts", str(contexts), "--domains",
                         "film,astronomy", "--out", str(out), "--seed", str(seed)),
                check=True,
            )  # fmt: skip
    for name, questions in (("langref", "langref_qa.jsonl"), ("langref-names", "langref_names_qa.jsonl")):
        if name in missing:
            out = str(eval_dir / SETS[name][0])
            subprocess.run(turborag("data", "langref", "--out", out, "--questions", questions), check=True)


def run_eval(model: str, name: str, eval_dir: Path, out: Path, modes: str | None = None) -> Path:
    """One set's eval (in `modes`, else the set's own), unless its predictions exist; returns the
    predictions file."""
    file, own_modes, tokens = SETS[name]
    modes = modes or own_modes
    pred = out / f"{name}.pred.jsonl"
    if pred.exists():
        print(f"{name}: {pred} exists, kept", file=sys.stderr)
        return pred
    partial = pred.with_suffix(".partial")
    with open(out / f"{name}.json", "w") as result, open(out / f"{name}.log", "w") as log:
        subprocess.run(
            turborag("eval", str(eval_dir / file), "--model", model, "--modes", modes,
                     "--max-new-tokens", str(tokens), "--abstain-threshold", "1", "--no-name-check", "--json",
                     "--predictions", str(partial)),
            check=True, stdout=result, stderr=log,
        )  # fmt: skip
    partial.rename(pred)  # only a finished eval counts as done
    return pred


def summary(name: str, pred: Path, threshold: float) -> list[str]:
    """Markdown rows: set, mode, then accuracy / abstained / falsely abstained: greedy, at the threshold,
    and at the threshold with the name check."""

    def cells(r: dict) -> str:
        u, a = r["abstain_rate"], r["false_abstain_rate"]
        return " / ".join(
            ["%.1f%%" % (100 * r["accuracy"]), "-" if u is None else "%.1f%%" % (100 * u),
             "-" if a is None else "%.1f%%" % (100 * a)]
        )  # fmt: skip

    return [
        f"| {name} | {mode} | {len(rows)} | {cells(table(rows, None))} | {cells(table(rows, threshold))} "
        f"| {cells(table(rows, threshold, name_check=True))} |"
        for mode, rows in read_groups(pred, lambda r: r["mode"]).items()
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="--model of turborag eval (an adapter folder, a name)")
    p.add_argument("--out", type=Path, required=True, help="folder for results, predictions and logs")
    p.add_argument("--eval-dir", type=Path, default=Path("eval"), help="held-out files (built if missing)")
    default_sets = ",".join(n for n in SETS if n != "realtext-doc-450")
    p.add_argument("--sets", default=default_sets, help=f"comma-separated, of: {', '.join(SETS)}")
    shipped = abstain_threshold(adapter_dir_for(DEFAULT_MODEL))
    p.add_argument(
        "--threshold",
        type=float,
        default=shipped,
        help=f"abstention threshold of the last columns (default: {shipped}, the shipped adapter's)",
    )
    p.add_argument(
        "--modes",
        help="modes of every eval, e.g. turbo for a quick look at a candidate (default: each set's own, full "
        "and turbo); a set whose predictions exist in --out is kept whatever its modes, so use a new --out",
    )
    args = p.parse_args()
    names = [s.strip() for s in args.sets.split(",") if s.strip()]
    unknown = [n for n in names if n not in SETS]
    if unknown or not names:
        p.error(f"unknown set(s) {', '.join(unknown) or '(none given)'}: use {', '.join(SETS)}")
    if not 0.0 < args.threshold <= 1.0:
        p.error(f"--threshold must be in (0, 1], got {args.threshold}")
    build_sets(args.eval_dir, names)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        rows += summary(name, run_eval(args.model, name, args.eval_dir, args.out, args.modes), args.threshold)
    print(
        f"| set | mode | n | greedy: right / abstained / falsely abstained | at {args.threshold} "
        f"| at {args.threshold} + name check |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
