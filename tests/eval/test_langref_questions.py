"""The hand-written questions over the demo corpus (turborag/data/langref_qa.jsonl, used by
scripts/langref_eval.py): every answerable one has spans that its corpus states, and the unanswerable ones ask
about what the corpus does not cover."""

import json
from importlib.resources import files

from turborag.bench.demo import QUESTIONS, corpus_files
from turborag.eval.metrics import ABSTAIN, contains_answer, normalize_answer


def _rows() -> list[dict]:
    text = files("turborag").joinpath("data/langref_qa.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_answerable_spans_are_in_the_corpus_and_unanswerable_ones_abstain():
    corpus = [path.read_text(encoding="utf-8") for path in corpus_files()]
    rows = _rows()
    assert len(rows) >= 50 and len({r["question"] for r in rows}) == len(rows)
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
