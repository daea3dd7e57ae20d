"""`--plot FILE` of `bench ttft`, `bench serve` and `eval`; turborag/bench/plots.py on hand-made results."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from helpers import cli_json
from typer.testing import CliRunner

from turborag.bench import plots
from turborag.cli import app
from turborag.core.defaults import DEFAULT_MAX_BATCH
from turborag_research.synth import generate, write_jsonl

runner = CliRunner()

TTFT = {
    "model": "gemma-3-270m-turbo",
    "device": "cpu",
    "dtype": "bfloat16",
    "rows": [  # made up, out of order (the plot sorts them)
        dict(zip(("context_tokens", "full_ttft_s", "turbo_ttft_s", "floor_ttft_s"), values))
        for values in ((512, 0.65, 0.095, 0.09), (8192, 38.9, 0.13, 0.1), (2051, 3.5, 0.11, 0.09))
    ],
}


def _mode(accuracy: float, ttft: float) -> dict:
    return {"n": 150, "accuracy": accuracy, "exact_match": accuracy, "ttft_s_mean": ttft, "ttft_s_p50": ttft}


EVAL = {
    "model": "gemma-3-270m",
    "skipped_lines": 0,
    "modes": {
        "full": _mode(0.433, 0.7),
        "turbo": _mode(0.28, 0.1),
        "full@runs/a-rather-long/path/to/the/fine-tune/model": _mode(0.9, 0.7),
        "turbo@runs/a-rather-long/path/to/the/fine-tune/model": _mode(0.9, 0.1),
    },
}


def _load(max_batch: int, scale: float) -> dict:
    return {
        "clients": 32,
        "max_batch": max_batch,
        "max_tokens": 64,
        "requests": 64,
        "errors": 0,
        "seconds": 10.0 / scale,
        "requests_per_s": 6.4 * scale,
        "tokens_per_s": 400.0 * scale,
        "ttft_p50_s": 2.0 / scale,
        "ttft_p99_s": 4.0 / scale,
        "itl_p50_s": 0.02,
        "itl_p99_s": None,
        "queue_depth_after": 0,
    }


SERVE = {"model": "tiny", "device": "cpu", "load": _load(8, 3.0), "load_max_batch_1": _load(1, 1.0)}
SWEEP = [{**_load(w, 1.0 + n / (2 if w == 1 else 8)), "clients": n} for n in (1, 4, 16, 32) for w in (1, 8)]


def assert_png(path: Path, min_side: int = 400) -> tuple[int, int]:
    """A PNG file that matplotlib drew something into: the signature, a sane size, more than a blank page."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= min_side and height >= min_side * 0.6, (width, height)
    assert len(data) > 15_000, f"{path}: only {len(data)} bytes"  # axes, bars, labels: not an empty canvas
    return width, height


def test_each_plot_from_hand_made_results(tmp_path):
    for draw, result, name in (
        (plots.plot_ttft, TTFT, "ttft.png"),
        (plots.plot_eval, EVAL, "eval.png"),
        (plots.plot_serve, SERVE, "serve.png"),
        (plots.plot_serve, {**SERVE, "sweep": SWEEP}, "serve-sweep.png"),
    ):
        out = draw(result, tmp_path / "sub" / name)  # a missing folder is made
        assert out == tmp_path / "sub" / name
        assert_png(out)
    # one model: no group labels, still a plot
    one = {"model": "m", "modes": {"full": _mode(0.5, 1.0), "turbo": _mode(0.5, 0.1)}}
    assert_png(plots.plot_eval(one, tmp_path / "one.png"))


def test_eval_groups_modes_per_model():
    groups = {}
    for key in EVAL["modes"]:
        mode, model = plots._split_mode(key, EVAL["model"])
        groups.setdefault(model, []).append(mode)
    assert groups == {
        "gemma-3-270m": ["full", "turbo"],
        "runs/a-rather-long/path/to/the/fine-tune/model": ["full", "turbo"],
    }
    assert plots._short("runs/a-rather-long/path/to/the/fine-tune/model").endswith("fine-tune/model")


def test_plot_any_tells_the_commands_apart_and_refuses_other_json(tmp_path):
    for result in (TTFT, EVAL, SERVE):
        assert_png(plots.plot_any(result, tmp_path / "x.png"))
    with pytest.raises(ValueError, match="not the --json output"):
        plots.plot_any({"rows": [{"batch_size": 1, "tok_s": 5.0}]}, tmp_path / "y.png")
    with pytest.raises(ValueError, match="bench ttft"):
        plots.plot_ttft({"modes": {}}, tmp_path / "y.png")
    assert not (tmp_path / "y.png").exists()


def test_bench_plot_draws_a_saved_json(tmp_path):
    """`turborag bench plot JSON --out PNG`: the plot of a saved --json output, after the run."""
    saved = tmp_path / "serve.json"
    saved.write_text("a log line\n" + json.dumps(SERVE) + "\n")  # the JSON is the last line
    r = runner.invoke(app, ["bench", "plot", str(saved), "--out", str(tmp_path / "s.png")])
    assert r.exit_code == 0, r.output
    assert_png(tmp_path / "s.png")
    saved.write_text('{"something": "else"}\n')
    r = runner.invoke(app, ["bench", "plot", str(saved), "--out", str(tmp_path / "t.png")])
    assert (
        r.exit_code == 2 and r.stderr.startswith(f"error: {saved}: ") and "not the --json output" in r.stderr
    )
    r = runner.invoke(app, ["bench", "plot", str(tmp_path / "none.json"), "--out", str(tmp_path / "u.png")])
    assert r.exit_code == 2 and r.stderr.startswith("error: ")
    assert not (tmp_path / "t.png").exists() and not (tmp_path / "u.png").exists()


def test_missing_matplotlib_is_one_line_before_anything_runs(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    with pytest.raises(plots.PlotUnavailable, match=r"pip install 'turborag\[plot\]'"):
        plots.plot_ttft(TTFT, tmp_path / "x.png")
    data = tmp_path / "d.jsonl"
    write_jsonl(generate(1, 1), data)
    # no model named: had the check come after loading one, this would be a model error (or a download)
    for args in (
        ["bench", "ttft", "--plot", str(tmp_path / "p.png"), "--model", str(tmp_path / "nope")],
        ["bench", "serve", "--plot", str(tmp_path / "p.png"), "--model", str(tmp_path / "nope")],
        ["eval", str(data), "--plot", str(tmp_path / "p.png"), "--model", str(tmp_path / "nope")],
    ):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, r.output
        assert r.stderr.strip().splitlines() == [
            "error: --plot needs matplotlib: pip install 'turborag[plot]' (or pip install matplotlib)"
        ]
    assert not (tmp_path / "p.png").exists()


def test_bench_ttft_plot(tiny_model_dir, env):
    png = env / "ttft.png"
    args = ["bench", "ttft", "--model", tiny_model_dir, "--repeats", "1", "--chunk-tokens", "32", "--json"]
    out = cli_json(runner.invoke(app, [*args, "--context-tokens", "64,128", "--plot", str(png)]))
    assert [row["context_tokens"] for row in out["rows"]] == [64, 128]  # the JSON is unchanged
    assert_png(png)
    saved = env / "ttft.json"  # and the saved JSON draws the same plot later
    saved.write_text(json.dumps(out))
    r = runner.invoke(app, ["bench", "plot", str(saved), "--out", str(env / "again.png")])
    assert r.exit_code == 0, r.output
    assert assert_png(env / "again.png") == assert_png(png)
    # a plot that cannot be written is an error, after the results: the measurements are not lost
    bad = runner.invoke(app, [*args, "--context-tokens", "64", "--plot", "/"])
    assert bad.exit_code == 1 and bad.stderr.startswith("error: could not write the plot /")
    assert json.loads(bad.stdout.strip().splitlines()[-1])["rows"][0]["context_tokens"] == 64


def test_eval_plot_groups_models(tiny_model_dir, env):
    data = env / "d.jsonl"
    write_jsonl(generate(2, 2, seed=4), data)
    other = tiny_model_dir + "/"  # the same weights under another name: a second model group
    png = env / "eval.png"
    args = ["eval", str(data), "--model", tiny_model_dir, "--modes", f"full,turbo,turbo@{other}"]
    r = runner.invoke(app, [*args, "--max-new-tokens", "2", "--plot", str(png)])  # the table, and a plot
    assert r.exit_code == 0, r.output
    assert f"plot: {png}" in r.stderr and "accuracy" in r.stdout
    assert_png(png)


def test_bench_serve_plot(tiny_model_dir, env):
    png = env / "serve.png"
    args = ["bench", "serve", "--model", tiny_model_dir, "--clients", "3", "--rounds", "1", "--sweep", "1,3"]
    more = ["--max-tokens", "4", "--steps", "1", "--system-tokens", "64", "--json", "--plot", str(png)]
    r = runner.invoke(app, [*args, *more])
    out = cli_json(r)
    assert out["load"]["errors"] == 0 and out["load_max_batch_1"]["max_batch"] == 1
    # TTFT against concurrency: 1 client run both ways, the --clients runs reused as they are
    b = DEFAULT_MAX_BATCH
    assert [(row["clients"], row["max_batch"]) for row in out["sweep"]] == [(1, 1), (1, b), (3, 1), (3, b)]
    assert all(row["errors"] == 0 and row["requests"] == row["clients"] for row in out["sweep"])
    assert out["sweep"][2] == {k: out["load_max_batch_1"][k] for k in out["sweep"][2]}
    assert f"plot: {png}" in r.stderr
    width, _ = assert_png(png)
    assert width > 1400  # four panels: the sweep has its own
    bad = runner.invoke(app, [*args[:-1], "0,4"])
    assert bad.exit_code == 2 and "--sweep" in bad.output
