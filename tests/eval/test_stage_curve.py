"""turborag_research/experiments/stage_curve.py: a stage's curve from heldout_evals result folders, skipping
unevaluated points."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RUNNER = "turborag_research.experiments.stage_curve"


def _result(folder: Path, name: str, accuracy: float, mode: str = "turbo") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"modes": {mode: {"n": 150, "accuracy": accuracy}}}))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", RUNNER, *args], capture_output=True, text=True, timeout=120)


def test_plots_points_in_step_order_and_skips_missing(tmp_path):
    _result(tmp_path / "s0", "held16", 0.873)
    _result(tmp_path / "s40", "held16", 0.847)
    _result(tmp_path / "s110", "held16", 0.80)
    (tmp_path / "s80").mkdir()
    (tmp_path / "s80" / "held16.json").write_text("")  # an eval still running: its file is empty
    png = tmp_path / "curve.png"
    points = [f"{step}:{tmp_path / f's{step}'}" for step in (110, 0, 80, 40)]
    r = _run(*[a for pt in points for a in ("--point", pt)], "--sets", "held16", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "held16 0:87.3% 40:84.7% 110:80.0%"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rejects_a_set_no_folder_has_and_a_malformed_point(tmp_path):
    _result(tmp_path / "s0", "held16", 0.9, mode="full")
    r = _run("--point", f"0:{tmp_path / 's0'}", "--sets", "held16", "--plot", str(tmp_path / "x.png"))
    assert r.returncode != 0 and "no held16.json with mode turbo" in r.stderr
    r = _run("--point", str(tmp_path / "s0"), "--sets", "held16", "--plot", str(tmp_path / "x.png"))
    assert r.returncode != 0 and "STEP:DIR" in r.stderr


def test_a_point_can_name_its_mode_one_curve_per_set_and_mode(tmp_path):
    """Two runs of a stage in one figure: the TurboRAG fine-tune in turbo, the causal one in full."""
    start = tmp_path / "start"
    start.mkdir()
    (start / "held16.json").write_text(
        json.dumps({"modes": {"turbo": {"n": 150, "accuracy": 0.90}, "full": {"n": 150, "accuracy": 0.92}}})
    )
    _result(tmp_path / "turbo60", "held16", 0.94)
    _result(tmp_path / "causal60", "held16", 0.96, mode="full")
    _result(tmp_path / "causal30", "held16", 0.50, mode="turbo")  # a mode this curve does not plot
    png = tmp_path / "curve.png"
    turbo = [f"0:{start}", f"60:{tmp_path / 'turbo60'}"]
    causal = [f"0:{start}:full", f"30:{tmp_path / 'causal30'}:full", f"60:{tmp_path / 'causal60'}:full"]
    points = turbo + causal
    r = _run(*[a for pt in points for a in ("--point", pt)], "--sets", "held16", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["held16 turbo 0:90.0% 60:94.0%", "held16 full 0:92.0% 60:96.0%"]
