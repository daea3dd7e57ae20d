"""turborag_research/experiments/heldout_evals.py: one eval per set, a table of greedy and thresholded
results, resumable."""

from __future__ import annotations

import json
import subprocess
import sys

from turborag_research.synth import generate, write_jsonl

RUNNER = "turborag_research.experiments.heldout_evals"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", RUNNER, *args], capture_output=True, text=True, timeout=600)


def test_runs_each_set_then_keeps_finished_ones(tiny_model_dir, env):
    eval_dir, out = env / "eval", env / "out"
    eval_dir.mkdir()
    write_jsonl(generate(3, 2, seed=1), eval_dir / "held5.jsonl")
    write_jsonl(generate(2, 2, seed=2, unanswerable=1.0), eval_dir / "unanswerable-doc-eval.jsonl")
    args = ["--model", tiny_model_dir, "--out", str(out), "--eval-dir", str(eval_dir)]

    r = _run(*args, "--sets", "held5,unanswerable-doc", "--threshold", "0.5")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith(("| held5", "| unans"))]
    assert [row.split(" | ")[:3] for row in rows] == [
        ["| held5", "full", "3"],
        ["| held5", "turbo", "3"],
        ["| unanswerable-doc", "turbo", "2"],
        ["| unanswerable-doc", "full", "2"],
    ]
    # answerable sets have no abstention rate, unanswerable ones no false-abstention rate
    assert rows[0].split(" | ")[3].split(" / ")[1] == "-"
    assert rows[2].split(" | ")[3].split(" / ")[2] == "-"
    # the unanswerable questions name an entity whose passage is gone: the name check declines the film (two
    # capitalized words), not the one-word city, whatever the tiny model answered
    preds = [json.loads(line) for line in (out / "unanswerable-doc.pred.jsonl").read_text().splitlines()]
    assert {tuple(p.get("missing_names", ())) for p in preds} == {(), ("The Kraesoutoth Covenant",)}
    assert all(float(row.split(" | ")[5].split(" / ")[1][:-1]) >= 50.0 for row in rows[2:])
    assert (out / "held5.pred.jsonl").exists() and not list(out.glob("*.partial"))

    before = (out / "held5.json").read_text()
    r = _run(*args, "--sets", "held5")  # a finished set is not evaluated again
    assert r.returncode == 0, r.stderr
    assert "exists, kept" in r.stderr and (out / "held5.json").read_text() == before


def test_modes_override_the_sets_own(tiny_model_dir, env):
    eval_dir, out = env / "eval", env / "out"
    eval_dir.mkdir()
    write_jsonl(generate(2, 2, seed=1), eval_dir / "held16.jsonl")
    args = ["--model", tiny_model_dir, "--out", str(out), "--eval-dir", str(eval_dir), "--sets", "held16"]
    r = _run(*args, "--modes", "turbo")
    assert r.returncode == 0, r.stderr
    rows = [line.split(" | ")[:3] for line in r.stdout.splitlines() if line.startswith("| held16")]
    assert rows == [["| held16", "turbo", "2"]]


def test_bad_arguments_are_refused(env):
    r = _run("--model", "m", "--out", str(env / "o"), "--sets", "held5,nope")
    assert r.returncode == 2 and "unknown set(s) nope" in r.stderr
    r = _run("--model", "m", "--out", str(env / "o"), "--threshold", "0")
    assert r.returncode == 2 and "--threshold must be in (0, 1]" in r.stderr
