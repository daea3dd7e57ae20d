"""`turborag data langref`: the hand-written demo-corpus questions with the passages the demo retrieves for
them, as an eval file; a store without a catalog or an unknown question file is one clear error."""

from __future__ import annotations

import json
import shutil
from importlib.resources import files

from typer.testing import CliRunner

from turborag.bench.demo import corpus_files
from turborag.cli import app

runner = CliRunner()


def _questions(name: str = "langref_qa.jsonl") -> list[dict]:
    text = files("turborag").joinpath("data", name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_langref_retrieves_each_questions_passages_from_the_demo_store(env, tiny_model_dir):
    docs = env / "corpus"
    docs.mkdir()
    for path in corpus_files():
        shutil.copy(path, docs / path.name)
    store = env / "home" / "demo-store"  # the default --store: where `turborag demo` puts it
    r = runner.invoke(app, ["ingest", str(docs), "--store", str(store), "--model", tiny_model_dir, "--json"])
    assert r.exit_code == 0, r.output

    out = env / "eval" / "langref-eval.jsonl"
    r = runner.invoke(app, ["data", "langref", "--out", str(out), "--keep-misses"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    asked = _questions()
    assert [row["question"] for row in rows] == [q["question"] for q in asked]  # every one, in file order
    assert all(len(row["contexts"]) == 3 and row["source"] == "langref" for row in rows)
    unanswerable = sum(not q.get("answerable", True) for q in asked)
    assert sum(not row["answerable"] for row in rows) == unanswerable > 0
    assert f"{len(rows) - unanswerable} answerable, {unanswerable} unanswerable" in r.stderr

    r = runner.invoke(app, ["data", "langref", "--out", str(out), "--top-k", "1", "--questions",
                            "langref_names_qa.jsonl"])  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    names = _questions("langref_names_qa.jsonl")
    misses = int(r.stderr.split("; ")[1].split()[0])
    assert len(rows) == len(names) - misses and all(len(row["contexts"]) == 1 for row in rows)
    assert "left out" in r.stderr


def test_langref_refuses_a_store_without_catalog_and_an_unknown_question_file(env):
    out = env / "x.jsonl"
    r = runner.invoke(app, ["data", "langref", "--out", str(out)])
    assert r.exit_code == 2 and "has no catalog: run `turborag demo`" in r.stderr
    store = env / "store"
    store.mkdir()
    (store / "catalog.sqlite").write_text("")
    r = runner.invoke(
        app, ["data", "langref", "--out", str(out), "--store", str(store), "--questions", "x.jsonl"]
    )
    assert r.exit_code == 2 and "no question file 'x.jsonl'" in r.stderr
    assert not out.exists()
