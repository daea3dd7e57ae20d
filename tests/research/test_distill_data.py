"""SQuAD-built distillation data: k passages a record, the answering paragraph among them and still holding
an answer, no distractor that mentions one, no article in both splits, paragraphs capped at sentence ends,
the same records for the same seed, and lines that `turborag eval` reads."""

import json

import pytest

from turborag.eval.evaluate import load_examples
from turborag_research.distill_data import build_splits, cap_words, load_squad, main, sentences

NAMES = ["Abel", "Brook", "Carver", "Dunn"]  # no "A": normalised answers drop articles
TOPICS = ["Volcano", "Glacier", "Harbour", "Orchard", "Lighthouse", "Canal", "Library", "Observatory"]


def _paragraph(topic: str, i: int) -> tuple[str, str]:
    """A paragraph of about 40 words about one topic, and its answer (a name unique to the paragraph)."""
    answer = f"{topic}son {NAMES[i]}"
    text = (
        f"The {topic.lower()} of record {i} was studied by {answer} in the spring. "
        f"Visitors described the {topic.lower()} as quiet and broad. "
        f"Local records kept by St. Anne's parish mention it often. "
        f"Surveyors returned every decade to measure it again and again."
    )
    return text, answer


def _fake_squad() -> dict:
    data = []
    for topic in TOPICS:
        paragraphs = []
        for i in range(4):
            text, answer = _paragraph(topic, i)
            qas = [
                {
                    "id": f"{topic}-{i}",
                    "question": f"Who studied the {topic.lower()} of record {i}?",
                    "answers": [{"text": answer, "answer_start": text.index(answer)}] * 2,
                },
                # its answer lies beyond the 20-word cap used below, so the question is dropped there
                {
                    "id": f"{topic}-{i}-late",
                    "question": "How often did surveyors return?",
                    "answers": [{"text": "every decade", "answer_start": text.index("every decade")}],
                },
            ]
            paragraphs.append({"context": text, "qas": qas})
        data.append({"title": topic, "paragraphs": paragraphs})
    return {"version": "1.1", "data": data}


@pytest.fixture
def raw(tmp_path):
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(_fake_squad()), encoding="utf-8")
    return path


def _title(record: dict) -> str:
    return record["source"].removeprefix("squad-v1.1:")


def test_cap_words_cuts_at_a_sentence_end():
    text = "One two three four. Five six seven eight. Nine ten eleven twelve."
    assert cap_words(text, 9) == "One two three four. Five six seven eight."
    assert cap_words(text, 3) == "One two three four."  # a first sentence is never cut
    assert cap_words(text, 100) == text
    # an initial or "St." is not a sentence end
    assert sentences("Met John F. Kennedy there. Then St. Louis. Done.") == [
        "Met John F. Kennedy there.",
        "Then St. Louis.",
        "Done.",
    ]


def test_load_keeps_only_questions_answered_in_the_capped_paragraph(raw):
    version, articles = load_squad(raw, max_words=20)
    assert version == "1.1"
    assert len(articles) == len(TOPICS)
    for article in articles:
        assert len(article.questions) == 4  # the four "who" questions; every "-late" one is dropped
        for q in article.questions:
            assert not q.id.endswith("-late")
            assert q.answers == [_paragraph(article.title, int(q.id.rsplit("-", 1)[1]))[1]]  # deduplicated
            assert all(a in article.paragraphs[q.paragraph] for a in q.answers)
        assert all(len(p.split()) <= 20 and p.endswith(".") for p in article.paragraphs)


def test_records_splits_and_determinism(raw):
    train, held_out = build_splits(raw, 12, 4, k=4, seed=5, max_words=20, eval_fraction=0.25)
    assert (len(train), len(held_out)) == (12, 4)
    for record in train + held_out:
        contexts = record["contexts"]
        assert len(contexts) == 4 and len(set(contexts)) == 4
        gold = contexts[record["answer_index"]]
        assert any(a in gold for a in record["answers"])
        assert gold.startswith(f"The {_title(record).lower()} of record")
        others = [c for i, c in enumerate(contexts) if i != record["answer_index"]]
        assert not any(a.lower() in c.lower() for a in record["answers"] for c in others)
        # one distractor from the question's own article, two from others
        assert sum(c.startswith(f"The {_title(record).lower()} ") for c in others) == 1
    train_titles = {_title(r) for r in train}
    eval_titles = {_title(r) for r in held_out}
    # no article on both sides, distractors included
    for record in held_out:
        assert not any(c.startswith(f"The {t.lower()} ") for t in train_titles for c in record["contexts"])
    assert train_titles and eval_titles and not train_titles & eval_titles
    assert build_splits(raw, 12, 4, k=4, seed=5, max_words=20, eval_fraction=0.25) == (train, held_out)
    assert build_splits(raw, 12, 4, k=4, seed=6, max_words=20, eval_fraction=0.25) != (train, held_out)


def test_near_distractors_come_from_the_question_s_own_article(raw):
    train, _ = build_splits(raw, 12, 4, k=4, seed=5, near=3, max_words=20, eval_fraction=0.25)
    for record in train:
        others = [c for i, c in enumerate(record["contexts"]) if i != record["answer_index"]]
        assert all(c.startswith(f"The {_title(record).lower()} ") for c in others)
    none_near, _ = build_splits(raw, 12, 4, k=4, seed=5, near=0, max_words=20, eval_fraction=0.25)
    for record in none_near:
        others = [c for i, c in enumerate(record["contexts"]) if i != record["answer_index"]]
        assert not any(c.startswith(f"The {_title(record).lower()} ") for c in others)


def test_too_few_questions_is_an_error(raw):
    with pytest.raises(ValueError, match="records fit"):
        build_splits(raw, 1000, 4, max_words=20, eval_fraction=0.25)


def test_cli_writes_files_turborag_eval_reads(raw, tmp_path, capsys):
    out = tmp_path / "out"
    main([str(raw), "--out-dir", str(out), "--train", "6", "--eval", "3", "--seed", "0", "--near", "0"])
    assert "6 records" in capsys.readouterr().out
    main([str(raw), "--out-dir", str(out), "--train", "6", "--eval", "3", "--prefix", "topic"])
    assert (out / "topic_train.jsonl").exists() and (out / "topic_eval.jsonl").exists()
    for name, n in (("distill_train.jsonl", 6), ("distill_eval.jsonl", 3)):
        examples, problems = load_examples(out / name)
        assert len(examples) == n and not problems
        assert all(len(ex.contexts) == 4 for ex in examples)
