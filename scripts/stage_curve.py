"""Accuracy against step for one fine-tune stage, drawn from `heldout_evals.py` result folders.

`finetune_curve.py` runs its own evals on one set; this script runs none. It reads the `SET.json` files that
`heldout_evals.py --out DIR` already wrote for each kept adapter of a stage (and for the adapter it started
from, as step 0), so a stage judged on several sets gets its curve without evaluating anything twice.

    python scripts/stage_curve.py --point 0:shipped-amx --point 40:ft9-s40 --point 80:ft9-s80 \\
        --point 110:ft9-turbo --sets held16,realtext-doc --mode turbo --plot docs/stage8_curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_points(points: list[str], name: str, mode: str) -> list[tuple[int, float]]:
    """(step, accuracy in %) for every STEP:DIR whose DIR/name.json holds `mode`."""
    found = []
    for point in points:
        step, _, folder = point.partition(":")
        result = Path(folder) / f"{name}.json"
        text = result.read_text() if result.is_file() else ""
        if not text.strip():
            continue  # not evaluated (yet)
        modes = json.loads(text)["modes"]
        if mode in modes:
            found.append((int(step), 100 * modes[mode]["accuracy"]))
    return sorted(found)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--point", action="append", required=True, help="STEP:DIR, DIR an --out of heldout_evals")
    p.add_argument("--sets", required=True, help="comma-separated set names, e.g. held16,realtext-doc")
    p.add_argument("--mode", default="turbo")
    p.add_argument("--title", default="accuracy against step, one fine-tune stage")
    p.add_argument("--plot", type=Path, required=True, help="PNG to write")
    args = p.parse_args()
    if any(":" not in point or not point.split(":")[0].isdigit() for point in args.point):
        p.error("each --point is STEP:DIR, e.g. 40:runs/ft9-s40")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name in [s.strip() for s in args.sets.split(",") if s.strip()]:
        curve = read_points(args.point, name, args.mode)
        if not curve:
            p.error(f"no {name}.json with mode {args.mode} in any --point folder")
        ax.plot([s for s, _ in curve], [a for _, a in curve], marker="o", label=f"{name} ({args.mode})")
        print(name, " ".join(f"{s}:{a:.1f}%" for s, a in curve))
    ax.set_xlabel("step of this stage (0 = the adapter it started from)")
    ax.set_ylabel("accuracy (%), 150 questions")
    ax.set_title(args.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
