"""The promotion gate's sets and defaults, apart from the gate itself so that the command line can name
them without importing torch (eval/gate.py runs the evals)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GateSet:
    """One gate set: its file, where the file lives ("rgb" or "eval" folder), and answer length."""

    file: str
    where: str
    max_new_tokens: int = 32


GATE_SETS: dict[str, GateSet] = {
    "rgb-en5": GateSet("en5.jsonl", "rgb"),
    "rgb-en5-qshuf": GateSet("en5_qshuf.jsonl", "rgb"),
    "rgb-noise08": GateSet("en5_noise08.jsonl", "rgb"),
    "rgb-noise08-qshuf": GateSet("en5_noise08_qshuf.jsonl", "rgb"),
    "rgb-none": GateSet("en_none.jsonl", "rgb"),
    "synth-unseen": GateSet("synth-unseen-eval.jsonl", "eval"),
    "synth-seen": GateSet("synth-seen-eval.jsonl", "eval"),
    "synth-topical": GateSet("synth-topical-eval.jsonl", "eval"),
    "realtext-doc": GateSet("realtext-doc-eval.jsonl", "eval", 48),
    "prose-doc": GateSet("prose-doc-eval.jsonl", "eval", 48),
    "prose-topical-doc": GateSet("prose-topical-doc-eval.jsonl", "eval", 48),
    "langref": GateSet("langref-eval.jsonl", "eval", 48),
}
GATE_MODES = ("full", "turbo")
ALPHA = 0.05


def set_file(name: str, rgb_dir: Path, eval_dir: Path) -> Path:
    """The file of a gate set."""
    spec = GATE_SETS[name]
    return (rgb_dir if spec.where == "rgb" else eval_dir) / spec.file
