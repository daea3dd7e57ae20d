"""Ctrl-C during `turborag ingest`: one line saying what is kept and how to resume, exit 130; and the ingest's
progress as plain lines when stderr is a log file rather than a terminal."""

from __future__ import annotations

import json
import re

from helpers import write_corpus
from typer.testing import CliRunner

from turborag.cli import app, documents
from turborag.core import progress

runner = CliRunner()
LINE = r"interrupted: (\d+) of (\d+) chunk caches saved; run the same command again to resume"


def test_ctrl_c_during_ingest_says_how_many_chunks_are_saved_and_a_rerun_resumes(
    tmp_path, tiny_model_dir, monkeypatch
):
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(progress, "EVERY_S", 0.0)  # a plain progress line at every batch
    docs = write_corpus(tmp_path / "docs")
    # small chunks: a few hundred, several store groups (the engine stores every 32 computed caches)
    cmd = ["ingest", str(docs), "--store", str(tmp_path / "store"), "--model", tiny_model_dir]
    cmd += ["--chunk-tokens", "8", "--overlap", "0"]
    advance, done = documents.RichProgress.advance, []

    def ctrl_c_in_the_second_group(self, chunks: int, tokens: int) -> None:
        advance(self, chunks, tokens)
        done.append(chunks)
        if sum(done) > 40:  # Ctrl-C pressed while a batch computes
            raise KeyboardInterrupt

    monkeypatch.setattr(documents.RichProgress, "advance", ctrl_c_in_the_second_group)
    r = runner.invoke(app, cmd)
    assert r.exit_code == 130, r.output
    assert "Traceback" not in r.output and "Aborted" not in r.output
    lines = r.stderr.strip().splitlines()
    assert re.fullmatch(r"ingest: \d+/\d+ chunks, \d+%, \d+ s elapsed.*", lines[0]), lines  # not a TTY
    last = re.fullmatch(LINE, lines[-1])
    assert last, lines[-1]
    saved, total = int(last[1]), int(last[2])
    assert 32 <= saved < total

    done.clear()
    monkeypatch.setattr(documents.RichProgress, "advance", lambda self, chunks, tokens: done.append(chunks))
    out = runner.invoke(app, [*cmd, "--json"])
    assert out.exit_code == 0, out.output
    assert sum(done) == total - saved  # the rerun computes only what the interrupted run had not saved
    assert json.loads(out.stdout)["documents"] == 10
