"""Accuracy against step for one fine-tune stage, drawn from `heldout_evals` result folders.

`finetune_curve` runs its own evals on one set; this runner runs none. It reads the `SET.json` files that
`heldout_evals --out DIR` already wrote for each kept adapter of a stage (and for the adapter it started
from, as step 0), so a stage judged on several sets gets its curve without evaluating anything twice.

    python -m turborag_research.experiments.stage_curve --point 0:shipped-amx --point 40:ft9-s40 \\
        --point 80:ft9-s80 --point 110:ft9-turbo --sets held16,realtext-doc --mode turbo \\
        --plot docs/stage8_curve.png

A point may name its own mode, STEP:DIR:MODE, so that one figure holds two runs of a stage, each in the mode
it is trained for: the TurboRAG fine-tune's points in turbo, the causal fine-tune's in full (one curve per set
and mode).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def parse_point(point: str, default_mode: str) -> tuple[int, Path, str]:
    """STEP:DIR or STEP:DIR:MODE -> (step, folder, mode)."""
    step, _, rest = point.partition(":")
    folder, _, mode = rest.partition(":")
    return int(step), Path(folder), mode or default_mode


def read_points(points: list[tuple[int, Path, str]], name: str, mode: str) -> list[tuple[int, float]]:
    """(step, accuracy in %) for every point in `mode` whose DIR/name.json holds that mode."""
    found = []
    for step, folder, point_mode in points:
        if point_mode != mode:
            continue  # another curve's point
        result = folder / f"{name}.json"
        text = result.read_text() if result.is_file() else ""
        if not text.strip():
            continue  # not evaluated (yet)
        modes = json.loads(text)["modes"]
        if mode in modes:
            found.append((step, 100 * modes[mode]["accuracy"]))
    return sorted(found)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--point", action="append", required=True, help="STEP:DIR[:MODE], DIR an --out of heldout_evals"
    )
    p.add_argument("--sets", required=True, help="comma-separated set names, e.g. held16,realtext-doc")
    p.add_argument("--mode", default="turbo")
    p.add_argument("--title", default="accuracy against step, one fine-tune stage")
    p.add_argument("--plot", type=Path, required=True, help="PNG to write")
    args = p.parse_args()
    if any(":" not in point or not point.split(":")[0].isdigit() for point in args.point):
        p.error("each --point is STEP:DIR or STEP:DIR:MODE, e.g. 40:runs/ft9-s40")
    points = [parse_point(point, args.mode) for point in args.point]
    modes = list(dict.fromkeys(mode for _, _, mode in points))  # in the order first named

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name in [s.strip() for s in args.sets.split(",") if s.strip()]:
        for mode in modes:
            curve = read_points(points, name, mode)
            if not curve:
                p.error(f"no {name}.json with mode {mode} in any --point folder")
            ax.plot([s for s, _ in curve], [a for _, a in curve], marker="o", label=f"{name} ({mode})")
            print(name if len(modes) == 1 else f"{name} {mode}", " ".join(f"{s}:{a:.1f}%" for s, a in curve))
    ax.set_xlabel("step of this stage (0 = the adapter it started from)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(args.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
