"""The hand-written questions over the demo corpus (turborag/data/langref_qa.jsonl and, naming code the way
users write it, langref_names_qa.jsonl; used by `turborag data langref`): every answerable one has spans
that its corpus states, and the unanswerable ones ask about what the corpus does not cover."""

import json
from importlib.resources import files

import pytest

from turborag.bench.demo import QUESTIONS, corpus_files
from turborag.core.grounding import missing_names, question_names
from turborag.eval.metrics import ABSTAIN, contains_answer, normalize_answer


def _rows(name: str = "langref_qa.jsonl") -> list[dict]:
    text = files("turborag").joinpath("data", name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(("name", "at_least"), [("langref_qa.jsonl", 50), ("langref_names_qa.jsonl", 30)])
def test_answerable_spans_are_in_the_corpus_and_unanswerable_ones_abstain(name, at_least):
    corpus = [path.read_text(encoding="utf-8") for path in corpus_files()]
    rows = _rows(name)
    assert len(rows) >= at_least and len({r["question"] for r in rows}) == len(rows)
    for r in rows:
        if r.get("answerable", True):
            found = [a for a in r["answers"] if any(contains_answer(doc, [a]) for doc in corpus)]
            assert found == r["answers"], (r["question"], set(r["answers"]) - set(found))
            assert all(normalize_answer(a) for a in r["answers"])
        else:
            assert r["answers"] == [ABSTAIN]
    assert sum(not r.get("answerable", True) for r in rows) >= 10


def test_the_demo_questions_are_among_them():
    assert set(QUESTIONS) <= {r["question"] for r in _rows()}


def test_the_named_questions_name_code_and_the_unanswerable_names_are_not_in_the_corpus():
    """Each question of langref_names_qa.jsonl names code for the name check to test; the answerable ones'
    names are all in the corpus (the check may decline one only if retrieval misses it), the unanswerable
    ones' names nowhere in it."""
    corpus = [path.read_text(encoding="utf-8") for path in corpus_files()]
    for r in _rows("langref_names_qa.jsonl"):
        assert question_names(r["question"]), r["question"]
        missing = missing_names(r["question"], corpus)
        assert (missing == []) is r.get("answerable", True), (r["question"], missing)
