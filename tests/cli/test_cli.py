"""The command line on a tiny model folder: eval JSON shape, bad input, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from turborag.cli import app
from turborag.core.modes import MODES
from turborag.core.prompt import ABSTAIN
from turborag_research.synth import generate, write_jsonl

runner = CliRunner()


def test_eval_json_reports_every_mode(tiny_model_dir, env):
    data = env / "d.jsonl"
    write_jsonl(generate(3, 2, seed=3), data)
    with open(data, "a") as f:  # bad lines are reported with their number and skipped
        f.write('{"answers": ["x"], "contexts": ["y"]}\n')
        f.write('{"question": "q", "answers": ["x"], "contexts": []}\n')
        f.write("not json\n")
    r = runner.invoke(app, ["eval", str(data), "--model", tiny_model_dir, "--json", "--max-new-tokens", "4"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(out["modes"]) == {"full", "turbo", "turbo-composite"}
    for m in out["modes"].values():
        assert m["n"] == 3
        assert set(m) == {"n", "accuracy", "exact_match", "ttft_s_mean", "ttft_s_p50"}
        assert 0 <= m["accuracy"] <= 1 and m["ttft_s_p50"] > 0
    assert out["model"] == tiny_model_dir and out["skipped_lines"] == 3
    # every mode question by question against full: the counts of disagreements bound the accuracy gap
    assert set(out["paired"]) == {"turbo", "turbo-composite"}
    for m, d in out["paired"].items():
        assert d["vs"] == "full" and 0 <= d["p"] <= 1
        gap = out["modes"][m]["accuracy"] - out["modes"]["full"]["accuracy"]
        assert abs(gap - (d["only_this_right"] - d["only_vs_right"]) / 3) < 1e-9
    assert "line 4: missing or empty 'question'" in r.stderr
    assert "line 5: 'contexts' must be a non-empty list" in r.stderr
    assert "line 6: not valid JSON" in r.stderr


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_eval_with_quantized_decode_weights(tiny_model_dir, env, kind):
    """`--decode-weights int8|int4` answers in every mode, recorded in the JSON; an unknown kind is
    refused."""
    data = env / "d.jsonl"
    write_jsonl(generate(3, 2, seed=3), data)
    args = ["eval", str(data), "--model", tiny_model_dir, "--json", "--modes", "full,turbo", "--limit", "2"]
    r = runner.invoke(app, [*args, "--decode-weights", kind, "--max-new-tokens", "4"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["decode_weights"] == kind and out["modes"]["turbo"]["n"] == 2
    r = runner.invoke(app, [*args, "--decode-weights", "int3"])
    assert r.exit_code == 2 and "use float, int8 or int4" in r.output


def test_eval_abstain_threshold_scores_and_abstains(tiny_model_dir, env):
    """A threshold every probability reaches: every answer is the abstention, each prediction carries the
    reply's log-probability, and the JSON records the threshold; 0 turns it off."""
    data, preds = env / "d.jsonl", env / "p.jsonl"
    write_jsonl(generate(3, 2, seed=3), data)
    args = ["eval", str(data), "--model", tiny_model_dir, "--json", "--modes", "full,turbo"]
    r = runner.invoke(app, [*args, "--abstain-threshold", "1e-300", "--predictions", str(preds)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["abstain_threshold"] == 1e-300
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    assert len(rows) == 6 and all(row["answer"] == ABSTAIN and row["abstain_logprob"] < 0 for row in rows)
    r = runner.invoke(app, [*args, "--abstain-threshold", "0", "--predictions", str(preds)])
    assert json.loads(r.stdout.strip().splitlines()[-1])["abstain_threshold"] is None
    assert not any("abstain_logprob" in line for line in preds.read_text().splitlines())
    r = runner.invoke(app, [*args, "--abstain-threshold", "1.5"])
    assert r.exit_code == 2


def test_eval_name_check_records_and_declines(tiny_model_dir, env):
    """Each prediction records the names no passage mentions, whether or not the check is on; with
    --name-check those questions are answered with the abstention and the JSON says the check was on."""
    data, preds = env / "d.jsonl", env / "p.jsonl"
    rows = [
        {"question": "Who founded Veltrano Dynamics?", "answers": ["Ismena Throll"],
         "contexts": ["Veltrano Dynamics was founded by Ismena Throll."]},
        {"question": "Who founded Veltreno Dynamics?", "answers": [ABSTAIN], "answerable": False,
         "contexts": ["Veltrano Dynamics was founded by Ismena Throll."]},
    ]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [
        "eval",
        str(data),
        "--model",
        tiny_model_dir,
        "--json",
        "--modes",
        "turbo",
        "--predictions",
        str(preds),
    ]
    for flag, on in (("--no-name-check", False), ("--name-check", True)):
        r = runner.invoke(app, [*args, flag, "--max-new-tokens", "40"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout.strip().splitlines()[-1])["name_check"] is on
        got = [json.loads(line) for line in preds.read_text().splitlines()]
        assert "missing_names" not in got[0] and got[1]["missing_names"] == ["Veltreno Dynamics"]
        assert (got[1]["answer"] == ABSTAIN) is on


def test_unknown_mode_is_one_line(env):
    data = env / "d.jsonl"
    write_jsonl(generate(1, 1), data)
    r = runner.invoke(app, ["eval", str(data), "--modes", "full,warp"])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [
        f"error: unknown mode warp: use one or more of {', '.join(MODES)}"
    ]


def test_all_bad_lines_fail(env):
    data = env / "d.jsonl"
    data.write_text('{"question": "q"}\n')
    r = runner.invoke(app, ["eval", str(data)])
    assert r.exit_code == 2 and "no usable question" in r.stderr


def test_missing_model_exits_nonzero_without_traceback(env):
    data = env / "d.jsonl"
    write_jsonl(generate(1, 1), data)
    r = subprocess.run(
        [sys.executable, "-m", "turborag", "eval", str(data), "--model", str(env / "nope")],
        capture_output=True,
        text=True,
        env={**os.environ, "TURBORAG_HOME": str(env / "home")},
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: model not found:")


def test_synth_command(env):
    out = env / "s.jsonl"
    r = runner.invoke(app, ["data", "synth", "--n", "4", "--contexts", "3", "--out", str(out)])
    assert r.exit_code == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 4 and all(len(x["contexts"]) == 3 for x in rows)
    r = runner.invoke(app, ["data", "synth", "--n", "4", "--out", str(out), "--domains", "nope"])
    assert r.exit_code == 2 and "error:" in r.stderr


def test_bench_small(tiny_model_dir, env):
    r = runner.invoke(
        app,
        [
            "bench",
            "ttft",
            "--model",
            tiny_model_dir,
            "--context-tokens",
            "64,128",
            "--repeats",
            "1",
            "--chunk-tokens",
            "32",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row["context_tokens"] for row in out["rows"]] == [64, 128]
    assert all(row["full_ttft_s"] > 0 and row["turbo_ttft_s"] > 0 for row in out["rows"])
    r = runner.invoke(app, ["bench", "ttft", "--context-tokens", "a,b"])
    assert r.exit_code == 2


def test_eval_mode_at_model_runs_other_models_in_one_table(tiny_model_dir, env):
    data = env / "d.jsonl"
    write_jsonl(generate(2, 2, seed=4), data)
    other = tiny_model_dir + "/"  # the same weights under another name: a second model group
    r = runner.invoke(
        app,
        [
            "eval",
            str(data),
            "--model",
            tiny_model_dir,
            "--modes",
            f"full,turbo@{other}",
            "--max-new-tokens",
            "2",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(out["modes"]) == {"full", f"turbo@{other}"}
    r = runner.invoke(app, ["eval", str(data), "--modes", "full,warp@x"])
    assert r.exit_code == 2 and "unknown mode warp@x" in r.stderr


def test_eval_cache_format_stores_quantized_caches(env, tiny_model_dir):
    """`eval --cache-format int8` measures the compressed format: its store holds about half the bytes."""
    data = env / "d.jsonl"
    write_jsonl(generate(2, 2, seed=5), data)

    def store_bytes(fmt: str) -> int:
        store = env / f"store-{fmt}"
        args = ["eval", str(data), "--model", tiny_model_dir, "--modes", "turbo", "--json"]
        r = runner.invoke(app, [*args, "--max-new-tokens", "2", "--store", str(store), "--cache-format", fmt])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout.strip().splitlines()[-1])["modes"]["turbo"]["n"] == 2
        return sum(f.stat().st_size for f in store.rglob("*") if f.is_file())

    assert store_bytes("int8") < 0.7 * store_bytes("fp16")
    bad = runner.invoke(app, ["eval", str(data), "--cache-format", "int4"])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: unknown --cache-format 'int4'")


def test_eval_json_shows_progress_on_stderr(tiny_model_dir, env, monkeypatch):
    """With --json, stdout holds the JSON alone and stderr the progress: a long evaluation whose stderr is a
    log file still says where it is."""
    from turborag.core import progress

    monkeypatch.setattr(progress, "EVERY_S", 0.0)  # a plain progress line at every question
    data = env / "d.jsonl"
    write_jsonl(generate(2, 2, seed=3), data)
    r = runner.invoke(app, ["eval", str(data), "--model", tiny_model_dir, "--json", "--max-new-tokens", "2"])
    assert r.exit_code == 0, r.output
    json.loads(r.stdout.strip())  # nothing but the JSON on stdout
    assert "eval: 2/2 q" in r.stderr
