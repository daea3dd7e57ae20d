"""One table of every model the gate has answered with: accuracy and declines per set and mode.

`turborag gate` compares two models; BENCHMARKS also wants the whole history side by side (the base model,
every shipped adapter, a candidate), from the answers the gates already stored (`--out` of `gate`,
default $TURBORAG_HOME/gate). Nothing is answered again here.

    python -m turborag_research.experiments.gate_table --out runs/gate --limit 100
    python -m turborag_research.experiments.gate_table --out runs/gate \\
        --models gemma-3-270m,adapters-86bd14a,gemma-3-270m-turbo

Cells are "accuracy (declined)": declined is the share of answerable questions declined (false declines),
on a set where no passage answers the share declined (there it is the right answer, and equals accuracy).
A model with no stored answers for a set shows "-".
"""

from __future__ import annotations

import argparse
from pathlib import Path

from turborag.eval.gate import GATE_MODES, GATE_SETS, declined, predictions_path, read_predictions


def cell(records: list[dict], mode: str) -> str:
    rows = [r for r in records if r["mode"] == mode]
    if not rows:
        return "-"
    unanswerable = all(r.get("answerable", True) is False for r in rows)
    counted = [r for r in rows if (r.get("answerable", True) is False) == unanswerable]
    acc = sum(r["correct"] for r in rows) / len(rows)
    dec = sum(declined(r) for r in counted) / len(counted)
    return f"{acc:.1%} ({dec:.0%})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the gate's answer folder")
    p.add_argument("--limit", type=int, default=100, help="the --limit the gates ran with")
    p.add_argument("--models", help="comma-separated labels (folder names), in row order; default all")
    p.add_argument("--sets", default=",".join(GATE_SETS), help="comma-separated gate sets, in column order")
    p.add_argument("--modes", default=",".join(GATE_MODES))
    args = p.parse_args()
    models = (
        args.models.split(",") if args.models else sorted(d.name for d in args.out.iterdir() if d.is_dir())
    )
    sets = [s for s in args.sets.split(",") if s]
    modes = args.modes.split(",")
    present = [s for s in sets if any(predictions_path(args.out, m, s, args.limit).exists() for m in models)]
    head = [f"{s} {m}" for s in present for m in modes]
    print("| model | " + " | ".join(head) + " |")
    print("|---|" + "---|" * len(head))
    for model in models:
        cells = []
        for s in present:
            path = predictions_path(args.out, model, s, args.limit)
            records = read_predictions(path) if path.exists() else []
            cells += [cell(records, m) for m in modes]
        print(f"| {model} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
