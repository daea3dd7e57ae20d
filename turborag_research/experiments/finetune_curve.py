"""Accuracy against training step: evaluate a fine-tune's kept adapters and plot the curve.

`turborag finetune --keep-every N` keeps the adapter every N steps under OUT/snapshots/step-N. This runner
runs `turborag eval` on each of them (and on the final adapter) for one mode per run, e.g. the cache-aware
run in `turbo` and the causal baseline in `full`, writes every result to a JSON file as it goes (a killed
run resumes from it), and draws accuracy against step next to the training loss (OUT/log.jsonl).

    python -m turborag_research.experiments.finetune_curve \\
        --run runs/ft-turbo:turbo --run runs/ft-causal:full --data runs/eval/held16.jsonl --limit 75 \\
        --results runs/curve.json --plot docs/finetune_curve.png

A second stage (`finetune --init-adapter FIRST/adapter`) counts its steps from zero: `--run OUT:MODE:OFFSET`
plots it OFFSET steps later (the first stage's steps), so both stages read as one curve.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path


def adapters(run: Path) -> list[tuple[int, Path]]:
    """(step, adapter folder) of every kept snapshot and of the final adapter, by step."""
    found = {}
    for snap in (run / "snapshots").glob("step-*"):
        if re.fullmatch(r"step-\d+", snap.name) and (snap / "adapter_config.json").exists():
            found[int(snap.name.split("-")[1])] = snap
    final = run / "adapter" / "turborag_finetune.json"
    if final.exists():
        meta = json.loads(final.read_text())
        found[int(meta.get("steps_trained", meta["steps"]))] = final.parent
    return sorted(found.items())


def evaluate(adapter: Path, mode: str, data: Path, limit: int | None, max_new_tokens: int) -> dict:
    cmd = [sys.executable, "-m", "turborag", "eval", str(data), "--model", str(adapter.resolve())]
    cmd += ["--modes", mode, "--max-new-tokens", str(max_new_tokens), "--json"]
    if limit:
        cmd += ["--limit", str(limit)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["modes"][mode]


def plot(results: dict, runs: list[tuple[Path, str, int]], data: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for run, mode, offset in runs:
        points = sorted(
            (int(step) + offset, r["accuracy"] * 100) for step, r in results.get(f"{run}:{mode}", {}).items()
        )
        if points:
            acc_ax.plot(*zip(*points), marker="o", label=f"{run.name} ({mode})")
        log = run / "log.jsonl"
        if log.exists():
            rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            # a resumed run logs the steps since its checkpoint again: the later entry is the one kept
            rows = sorted({r["step"]: r for r in rows}.values(), key=lambda r: r["step"])
            window = 10  # a running mean: single steps (4 examples) are noisy
            smooth = [
                sum(r["loss"] for r in rows[max(0, i - window + 1) : i + 1]) / min(i + 1, window)
                for i in range(len(rows))
            ]
            loss_ax.plot([r["step"] + offset for r in rows], smooth, label=run.name)
    acc_ax.set(xlabel="training step", ylabel="accuracy (%)", title=f"held-out accuracy: {data.name}")
    loss_ax.set(xlabel="training step", ylabel="training loss (mean of 10 steps)", title="training loss")
    for ax in (acc_ax, loss_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--run", action="append", required=True, help="OUT:MODE[:OFFSET], e.g. runs/ft-turbo:turbo"
    )
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--results", type=Path, required=True, help="JSON of every result (kept, resumed from)")
    p.add_argument("--plot", type=Path, required=True, help="PNG to write")
    args = p.parse_args()
    runs = []
    for spec in args.run:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            p.error(f"--run {spec!r}: expected OUT:MODE or OUT:MODE:OFFSET")
        runs.append((Path(parts[0]), parts[1], int(parts[2]) if len(parts) == 3 else 0))
    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    for run, mode, _ in runs:
        done = results.setdefault(f"{run}:{mode}", {})
        for step, adapter in adapters(run):
            if str(step) in done:
                continue
            done[str(step)] = evaluate(adapter, mode, args.data, args.limit, args.max_new_tokens)
            args.results.write_text(json.dumps(results, indent=1))
            print(f"{run.name} step {step} {mode}: {done[str(step)]['accuracy']:.3f}", flush=True)
    plot(results, runs, args.data, args.plot)


if __name__ == "__main__":
    main()
