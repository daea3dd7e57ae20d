"""Issue 39, "The first hour, again": every `--help` readable whole at 80 columns, and the mistakes of a
first hour (`--help`, a bad mode, a mistyped path) answered at once, without importing torch."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import typer
from typer.testing import CliRunner

from turborag.cli import app

runner = CliRunner()
HEAVY = ("torch", "transformers", "sentence_transformers", "fastapi")


def _commands(group, path: tuple[str, ...] = ()):
    """(path, click command) of every command and group under `group`, the group itself first."""
    yield path, group
    for name, cmd in getattr(group, "commands", {}).items():
        yield from _commands(cmd, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


def _squashed(text: str) -> str:
    """Text without whitespace: a help text wrapped over several lines still reads as one string."""
    return "".join(text.split())


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "turborag")
def test_help_at_80_columns_shows_every_help_text_whole(path):
    cmd = dict(COMMANDS)[path]
    r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"})  # rich and click read COLUMNS
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    out = _squashed(r.stdout)
    for param in cmd.params:
        if getattr(param, "help", None):
            assert _squashed(param.help) in out, (param.name, r.stdout)
    for name, sub in getattr(cmd, "commands", {}).items():  # a group's summaries: whole, not cut with "..."
        summary = (sub.help or "").split("\n\n")[0]
        assert _squashed(summary) in out, (name, r.stdout)
    if path == ("ingest",):  # rich markup ate "[ray]" here once
        assert "needs `pip install 'turborag[ray]'`" in " ".join(r.stdout.split()), r.stdout


def _run_cli(args: list[str], tmp_path) -> tuple[subprocess.CompletedProcess, float]:
    """The CLI's `main` in a fresh interpreter, as a user runs it; then which heavy modules got imported."""
    code = (
        "import sys\nfrom turborag.cli import main\n"
        f"sys.argv = ['turborag', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    env = {**os.environ, "TURBORAG_HOME": str(tmp_path / "home"), "COLUMNS": "80"}
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return r, time.perf_counter() - t


QUICK = [  # (args, exit code, what stderr says)
    (["--help"], 0, ""),
    (["ask", "--help"], 0, ""),
    (["ingest", "--help"], 0, ""),
    (["serve", "--help"], 0, ""),
    (["bench", "ttft", "--help"], 0, ""),
    (["ask", "Who rings the bell?", "--mode", "fastest"], 2, "error: unknown mode fastest"),
    (["eval", "{tmp}/q.jsonl", "--modes", "full,fastest"], 2, "error: unknown mode fastest"),
    (["eval", "{tmp}/nope.jsonl"], 2, "error: no such file"),
    (["ingest", "{tmp}/nope"], 2, "error: no such file or folder"),
    (["ask", "Who rings the bell?", "--store", "{tmp}/nope"], 2, "error: no store at"),
    (["remove", "x", "--store", "{tmp}/nope"], 2, "error: no store at"),
    (["serve", "--store", "{tmp}/nope"], 2, "error: no store at"),
    (["cache", "stats", "--store", "{tmp}/nope"], 2, "error: no store at"),
    (["bench", "ttft", "--context-tokens", "many"], 2, "error: --context-tokens must be"),
    (["bench", "ttft", "--ram-cache-bytes", "lots"], 2, "error: --ram-cache-bytes"),
    (["keys", "list", "--keys", "{tmp}/nope.json"], 0, ""),  # turborag.serve's light modules alone
    (["calibrate", "{tmp}/nope.jsonl"], 2, "error: no such file"),
]


@pytest.mark.parametrize("args,code,says", QUICK, ids=[" ".join(a) for a, _, _ in QUICK])
def test_help_and_argument_errors_answer_without_torch(args, code, says, tmp_path):
    (tmp_path / "q.jsonl").write_text('{"question": "q", "answers": ["a"], "contexts": ["c"]}\n')
    r, seconds = _run_cli([a.replace("{tmp}", str(tmp_path)) for a in args], tmp_path)
    assert r.returncode == code, r.stderr
    assert says in r.stderr, r.stderr
    assert "HEAVY []" in r.stderr, r.stderr  # torch alone takes seconds to import
    assert seconds < 3, f"{seconds:.1f} s"  # well under 1 s unloaded; room for a busy CI machine


def test_no_help_imports_torch():
    """`--help` of every command and group, one after the other in one fresh interpreter: none of them
    imports a heavy module (a command's own imports belong in its body, after its argument checks)."""
    code = (
        "import sys, typer\nfrom typer.testing import CliRunner\nfrom turborag.cli import app\n"
        f"for path in {[list(p) for p, _ in COMMANDS]!r}:\n"
        "    assert CliRunner().invoke(app, [*path, '--help']).exit_code == 0, path\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr  # the timing: QUICK above
