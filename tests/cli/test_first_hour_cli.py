"""A newcomer's first hour: one name for the default model, no third-party noise, bad options as one line,
and the question-answering defaults in the Python API too."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import write_corpus
from typer.testing import CliRunner

from turborag.cli import app
from turborag.core.defaults import BASE_MODEL, DEFAULT_MODEL

runner = CliRunner()


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The installed entry point, as a user runs it (typer's test runner skips `main`)."""
    cmd = [sys.executable, "-c", "from turborag.cli import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_one_name_for_the_default_model():
    for command in (["ingest", "--help"], ["serve", "--help"], ["ask", "--help"], ["eval", "--help"]):
        result = runner.invoke(app, command, env={"COLUMNS": "200"})  # rich sizes help from COLUMNS
        out = " ".join(result.stdout.split())
        assert DEFAULT_MODEL in out, command
        assert f"else {BASE_MODEL})" not in out and f"{BASE_MODEL} (default" not in out, command
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    assert f"`{BASE_MODEL}` (default" not in readme


def test_a_bad_option_value_is_one_error_line():
    r = _run("ask", "x", "--top-k", "0")
    assert r.returncode == 2
    assert (
        r.stderr.strip().startswith("error: Invalid value for '--top-k'") and len(r.stderr.splitlines()) == 1
    )
    r = _run("no-such-command")
    assert r.returncode == 2 and r.stderr.startswith("error: No such command")


def test_loading_a_model_prints_no_third_party_warnings(tmp_path, tiny_model_dir):
    env = {**os.environ, "TURBORAG_HOME": str(tmp_path / "home")}
    docs = write_corpus(tmp_path / "docs")
    r = _run("ingest", str(docs), "--model", tiny_model_dir, "--json", env=env)
    assert r.returncode == 0, r.stderr
    r = _run("ask", "Who rings the bell?", "--local", "--max-new-tokens", "2", env=env)
    assert r.returncode == 0, r.stderr
    assert "Warning" not in r.stderr and "warnings.warn" not in r.stderr, r.stderr


def test_the_python_api_stops_a_base_model_at_the_end_of_its_line(gemma_lm, tmp_path, monkeypatch):
    """A base model runs on into a made-up next question; the engine's defaults stop it, as the CLI does."""
    from turborag.core import generate as generate_mod
    from turborag.core.engine import Engine
    from turborag.store.kv_store import KVStore

    tok = gemma_lm.tokenizer
    run_on = tok(" 27\nQuestion: and then?", add_special_tokens=False)["input_ids"]
    script: list[int] = []  # the tokens the model "picks", one per step
    monkeypatch.setattr(generate_mod, "pick", lambda *a: script.pop(0))
    engine = Engine(gemma_lm, KVStore(tmp_path, "float32"))
    assert engine.layout.template == "plain"
    script[:] = run_on
    assert engine.answer("How old?", ["Odrun is 27."]).text == "27"
    script[:] = run_on
    assert engine.answer("How old?", ["Odrun is 27."], "full").text == "27"
