"""What an abstention threshold would do, from one eval run: accuracy, abstentions on unanswerable questions
and false abstentions on answerable ones, per mode, for several thresholds.

Run the eval with `--abstain-threshold 1`: every answer then carries the log-probability of the reply
"The passages do not say." (scored in the prefill forward) and is the greedy answer, since no probability
reaches 1. With threshold t the engine answers the abstention when that probability reaches t and the
greedy answer otherwise, so each threshold's answers follow from those predictions without decoding again.
Each prediction also records the names of its question that no passage mentions, so `--name-check` shows
what the engine's name check (core/grounding.py) adds, if the eval ran without it (`--no-name-check`):

    turborag eval eval/prose-unanswerable-doc-eval.jsonl --model gemma-3-270m-turbo --modes turbo,full \\
        --abstain-threshold 1 --no-name-check --max-new-tokens 48 --predictions p.jsonl
    python -m turborag_research.experiments.threshold_table p.jsonl --thresholds 0.5,0.4,0.35,0.3 \\
        [--name-check]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path

from turborag.eval.metrics import abstains


def table(rows: list[dict], threshold: float | None, name_check: bool = False) -> dict[str, float | None]:
    """Accuracy, abstain rate (unanswerable) and false-abstain rate (answerable) of one mode's rows, with
    the engine's name check on top if asked (each prediction records the names no passage mentions)."""
    right = abstained_u = abstained_a = n_u = n_a = 0
    for r in rows:
        forced = threshold is not None and r["abstain_logprob"] >= math.log(threshold)
        forced = forced or (name_check and bool(r.get("missing_names")))
        abstained = forced or abstains(r["answer"])
        if r.get("answerable", True):
            n_a += 1
            abstained_a += abstained
            right += r["correct"] and not forced
        else:
            n_u += 1
            abstained_u += abstained
            right += abstained
    return {
        "accuracy": right / len(rows),
        "abstain_rate": abstained_u / n_u if n_u else None,
        "false_abstain_rate": abstained_a / n_a if n_a else None,
    }


def read_groups(path: Path, key: Callable[[dict], str]) -> dict[str, list[dict]]:
    """The predictions of a `turborag eval --predictions` file, grouped by key(row), in file order."""
    groups: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        groups.setdefault(key(r), []).append(r)
    return groups


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("predictions", type=Path, nargs="+", help="`turborag eval --predictions` files")
    p.add_argument("--thresholds", default="0.5,0.4,0.35,0.3,0.25", help="comma-separated, in (0, 1]")
    p.add_argument("--name-check", action="store_true", help="with the engine's name check on top")
    args = p.parse_args()
    thresholds = [None] + [float(t) for t in args.thresholds.split(",")]
    for path in args.predictions:
        for name, rows in read_groups(path, lambda r: f"{r['mode']}@{r['model']}").items():
            if any("abstain_logprob" not in r for r in rows):
                raise SystemExit(
                    f"{path}: {name} has answers without abstain_logprob: eval with --abstain-threshold 1"
                )
            print(f"{path.name} {name} ({len(rows)} answers)")
            print("  threshold  accuracy  abstains (unanswerable)  false abstentions (answerable)")
            for t in thresholds:
                r = table(rows, t, args.name_check)
                u, a = r["abstain_rate"], r["false_abstain_rate"]
                print(
                    f"  {'greedy' if t is None else t:>9}  {r['accuracy']:8.1%}  "
                    f"{'-' if u is None else f'{u:.1%}':>23}  {'-' if a is None else f'{a:.1%}':>30}"
                )


if __name__ == "__main__":
    main()
