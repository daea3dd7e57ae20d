"""scripts/stage_curve.py: a stage's curve from heldout_evals result folders, skipping unevaluated points."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "stage_curve.py"


def _result(folder: Path, name: str, accuracy: float, mode: str = "turbo") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"modes": {mode: {"n": 150, "accuracy": accuracy}}}))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


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
