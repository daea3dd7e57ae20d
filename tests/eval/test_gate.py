"""The promotion gate: paired verdicts per set and mode, stored answers reused, the CLI's exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from turborag.cli import app
from turborag.eval import gate as g
from turborag.eval.evaluate import load_examples
from turborag.eval.metrics import ABSTAIN

runner = CliRunner()


def _records(correct: list[bool], mode: str = "full", answerable: bool = True) -> list[dict]:
    out = []
    for line, ok in enumerate(correct, start=1):
        answer = ("right" if ok else "wrong") if answerable else (ABSTAIN if ok else "Paris")
        r = {"line": line, "mode": mode, "answer": answer, "correct": ok}
        if not answerable:
            r["answerable"] = False
        out.append(r)
    return out


def test_compare_fails_a_candidate_worse_beyond_noise():
    current = _records([True] * 20)
    worse = _records([False] * 10 + [True] * 10)  # 10 disagreements, all against it: p = 0.002
    (row,) = g.compare("s", worse, current, ["full"])
    assert (row.only_candidate, row.only_current, row.verdict) == (0, 10, "worse")
    assert row.candidate == 0.5 and row.current == 1.0 and not g.passed([row])
    (row,) = g.compare("s", current, worse, ["full"])
    assert row.verdict == "better" and g.passed([row])


def test_compare_calls_a_small_gap_noise():
    current = _records([True] * 20)
    slightly = _records([False, False, True] + [True] * 17)  # 2 against 0: p = 0.5
    (row,) = g.compare("s", slightly, current, ["full"])
    assert row.verdict == "same" and row.p == 0.5 and g.passed([row])
    (row,) = g.compare("s", slightly, current, ["full"], alpha=0.6)  # a looser gate sees it
    assert row.verdict == "worse"


def test_compare_reports_declines():
    # answerable: the share declined is the false declines
    cand = _records([True, True, False, False])
    cand[2]["answer"] = "The passages do not say."
    (row,) = g.compare("s", cand, _records([True] * 4), ["full"])
    assert row.candidate_declined == 0.25 and row.current_declined == 0.0
    # nothing answerable: the share declined is the right answer
    cand, cur = _records([True, False], answerable=False), _records([True, True], answerable=False)
    (row,) = g.compare("none", cand, cur, ["full"])
    assert row.candidate_declined == 0.5 and row.current_declined == 1.0


def test_compare_pairs_by_mode_and_line_and_refuses_different_questions():
    cand = _records([True, False], "full") + _records([False, False], "turbo")
    cur = _records([True, True], "full") + _records([True, True], "turbo")
    rows = g.compare("s", cand, cur, ["full", "turbo"])
    assert [(r.mode, r.only_current) for r in rows] == [("full", 1), ("turbo", 2)]
    with pytest.raises(ValueError, match="same --limit"):
        g.compare("s", _records([True] * 3), _records([True] * 2), ["full"])


class _Engine:
    """Answers every question with `reply` and counts the calls, so the stored answers are seen reused."""

    def __init__(self, reply: str):
        self.reply, self.calls = reply, 0
        self.lm = type("LM", (), {"name": "fake"})()

    def precompute(self, passages, on_batch=None):
        pass

    def answer(self, question, contexts, mode, params):
        self.calls += 1
        return type("A", (), {"text": self.reply, "ttft_s": 0.01, "abstain_logprob": None})()


def _set(path, n=3):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"question": f"q{i}", "answers": ["Oslo"], "contexts": ["Oslo is in Norway."]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_answer_sets_stores_and_reuses(tmp_path):
    files = {"realtext-doc": _set(tmp_path / "a.jsonl")}
    engine = _Engine("It is Oslo.")
    got = g.answer_sets(engine, "m", files, tmp_path / "out", 2, ["full", "turbo"], progress=False)
    # warm-up + 2 questions x 2 modes
    assert (
        engine.calls == 5 and len(got["realtext-doc"]) == 4 and all(r["correct"] for r in got["realtext-doc"])
    )
    stored = g.predictions_path(tmp_path / "out", "m", "realtext-doc", 2)
    assert stored.is_file() and not list(stored.parent.glob("*.partial"))
    assert not g.needs_answers("m", files, tmp_path / "out", 2, ["full", "turbo"])
    assert g.needs_answers("m", files, tmp_path / "out", 3, ["full", "turbo"])  # another limit: another run
    again = g.answer_sets(None, "m", files, tmp_path / "out", 2, ["full", "turbo"], progress=False)
    assert again == got


def test_stale_answers_are_answered_again(tmp_path):
    """Answers stored for a set that was since rebuilt, for other modes, or for an adapter since retrained
    under the same name are never compared: the model answers again."""
    out, modes = tmp_path / "out", ["full", "turbo"]
    files = {"realtext-doc": _set(tmp_path / "a.jsonl")}
    g.answer_sets(_Engine("It is Oslo."), "m", files, out, 2, modes, progress=False)
    assert not g.needs_answers("m", files, out, 2, modes)
    assert g.needs_answers("m", files, out, 2, ["full"])
    rows = [json.loads(line) for line in files["realtext-doc"].read_text().splitlines()]
    rows[1]["answers"] = ["Bergen"]  # the set rebuilt: one gold answer differs
    files["realtext-doc"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert g.needs_answers("m", files, out, 2, modes)
    engine = _Engine("It is Oslo.")
    got = g.answer_sets(engine, "m", files, out, 2, modes, progress=False)
    assert engine.calls == 5
    assert [r["correct"] for r in got["realtext-doc"] if r["mode"] == "full"] == [True, False]
    # an adapter is known by its files: retrained in place, its key changes
    adapter = tmp_path / "runs" / "ft"
    adapter.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors", "turborag_finetune.json"):
        (adapter / name).write_text("{}")
    examples = load_examples(files["realtext-doc"], 2)[0]
    before = g.answers_key(str(adapter), examples, modes)
    (adapter / "adapter_model.safetensors").write_text("other weights")
    assert g.answers_key(str(adapter), examples, modes) != before
    # answers computed in another dtype are not compared with this dtype's: both sides measured alike
    fp32, bf16 = g.computed_as(dtype="float32"), g.computed_as(dtype="bfloat16")
    assert fp32 != bf16 and g.computed_as() in (fp32, bf16)
    g.answer_sets(_Engine("It is Oslo."), "m", files, out, 2, modes, progress=False, computed=fp32)
    assert not g.needs_answers("m", files, out, 2, modes, fp32)
    assert g.needs_answers("m", files, out, 2, modes, bf16)
    assert g.needs_answers("m", files, out, 2, modes, g.computed_as(dtype="float32", template="plain"))
    # answers stored without a key (before keys existed) count as stale
    key_file = g.predictions_path(out, "m", "realtext-doc", 2).with_name("realtext-doc.n2.key")
    key_file.unlink()
    assert g.needs_answers("m", files, out, 2, modes)


def test_model_label_keeps_two_adapters_apart():
    assert g.model_label("gemma-3-270m-turbo") == "gemma-3-270m-turbo"
    assert g.model_label("runs/ft2/adapter") != g.model_label("runs/ft3/adapter")


def _store_answers(out, label, name, correct, set_file=None):
    """Answers as the gate stores them; with the set's file, also their key, so the gate reuses them."""
    path = g.predictions_path(out, label, name, 100)
    path.parent.mkdir(parents=True, exist_ok=True)
    recs = _records(correct, "full") + _records(correct, "turbo")
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    if set_file is not None:
        key = g.answers_key(label, load_examples(set_file, 100)[0], ["full", "turbo"])
        path.with_name(f"{name}.n100.key").write_text(key)


def test_cli_fails_a_worse_candidate_from_stored_answers(tmp_path):
    set_file = _set(tmp_path / "eval" / "realtext-doc-eval.jsonl", n=20)
    eval_dir, out = set_file.parent, tmp_path / "gate"
    _store_answers(out, "cand", "realtext-doc", [False] * 12 + [True] * 8, set_file)
    _store_answers(out, "cur", "realtext-doc", [True] * 20, set_file)
    args = ["gate", "cand", "--against", "cur", "--sets", "realtext-doc", "--eval-dir", str(eval_dir),
            "--out", str(out)]  # fmt: skip
    r = runner.invoke(app, args)  # both models' answers are stored: nothing is loaded
    assert r.exit_code == 1, r.output
    assert "FAILED" in r.output and "realtext-doc (full)" in r.output and "| worse |" in r.output
    r = runner.invoke(app, [*args, "--json"])
    out_json = json.loads(r.stdout.strip().splitlines()[-1])
    assert out_json["passed"] is False and {row["verdict"] for row in out_json["rows"]} == {"worse"}
    r = runner.invoke(app, ["gate", "cur", "--against", "cand", *args[4:]])
    assert r.exit_code == 0 and "PASSED" in r.output


def test_cli_names_missing_sets_and_how_to_build_them(tmp_path, monkeypatch):
    monkeypatch.delenv("TURBORAG_RGB_DIR", raising=False)
    r = runner.invoke(app, ["gate", "a", "--against", "b", "--sets", "rgb-en5,synth-unseen,langref",
                            "--eval-dir", str(tmp_path)])  # fmt: skip
    assert r.exit_code == 2
    assert "rgb-en5: no RGB folder" in r.output and "CC BY-NC-SA" in r.output
    assert "synth-unseen" in r.output and "turborag data mix" in r.output
    assert "turborag data langref" in r.output
    r = runner.invoke(app, ["gate", "a", "--against", "b", "--sets", "rgb-en5,nope"])
    assert r.exit_code == 2 and "unknown gate set nope" in r.output
    r = runner.invoke(
        app, ["gate", "a", "--against", "a", "--sets", "realtext-doc", "--eval-dir", str(tmp_path)]
    )
    assert r.exit_code == 2


def test_cli_gate_on_a_tiny_model_end_to_end(tiny_model_dir, env):
    """Two copies of one tiny model answer alike, so the gate passes; an RGB file is read as it is."""
    rgb = env / "rgb"
    rgb.mkdir()
    rows = [
        {"question": "Who?", "answers": ["Oslo"], "contexts": ["Oslo.", "Bergen."], "rgb_id": 0},
        {"question": "Where?", "answers": ["x"], "contexts": ["No."], "answerable": False, "rgb_id": 1},
    ]
    (rgb / "en_none.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    copy = env / "copy" / "tiny"
    shutil.copytree(tiny_model_dir, copy)
    args = ["gate", str(copy), "--against", tiny_model_dir, "--sets", "rgb-none", "--rgb-dir", str(rgb),
            "--out", str(env / "gate"), "--json"]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["passed"] and [(row["mode"], row["n"], row["verdict"]) for row in res["rows"]] == [
        ("full", 2, "same"),
        ("turbo", 2, "same"),
    ]


def test_gate_table_lays_out_every_stored_model(tmp_path):
    """turborag_research/experiments/gate_table.py: every model the gate has answered with, in one table."""
    out = tmp_path / "gate"
    _store_answers(out, "base", "rgb-en5", [True, False, False, False])
    _store_answers(out, "shipped", "rgb-en5", [True, True, True, False])
    cmd = [sys.executable, "-m", "turborag_research.experiments.gate_table", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "| model | rgb-en5 full | rgb-en5 turbo |"
    assert lines[2] == "| base | 25.0% (0%) | 25.0% (0%) |" and lines[3].startswith("| shipped | 75.0%")
