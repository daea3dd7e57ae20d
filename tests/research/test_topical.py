"""Topical unanswerable twins (topical.py): the answering passage stays, minus every sentence that answers,
and the mix's `topical` share."""

from collections import Counter

import pytest

from turborag.eval.metrics import ABSTAIN
from turborag_research.mix import TRAIN_DOMAINS, build_eval_sets, build_mix
from turborag_research.prose import generate_prose
from turborag_research.synth import generate
from turborag_research.text import mentions, needles
from turborag_research.topical import MIN_WORDS, strip_answer, topical_twin

PASSAGE = (
    "The Velmora Bridge spans the river at its widest point. It was built by Anna Kestrel in the spring. "
    "Tourists cross the Velmora Bridge every summer."
)


def test_strip_answer_takes_out_only_the_sentences_that_answer():
    stripped = strip_answer(PASSAGE, ["Anna Kestrel"])
    assert stripped == (
        "The Velmora Bridge spans the river at its widest point. "
        "Tourists cross the Velmora Bridge every summer."
    )


def test_strip_answer_takes_out_a_fact_sheet_line_and_keeps_the_others():
    sheet = "Krarer\nPopulation: 117500\nMayor: Dougilmeix Fisa\nMain river: Gaegov River\nNotes: {}"
    notes = "Krarer is known for its narrow cobbled streets."
    assert strip_answer(sheet.format(notes), ["Dougilmeix Fisa"]) == (
        f"Krarer\nPopulation: 117500\nMain river: Gaegov River\nNotes: {notes}"
    )


def test_strip_answer_matches_answers_loosely_so_it_errs_towards_taking_out():
    """An answer written with other case or punctuation is still found, and a raw substring counts too
    (an "8" inside "78"): a sentence too many taken out costs a little topic, one too few a wrong label."""
    assert strip_answer(PASSAGE, ["anna kestrel!"]) == strip_answer(PASSAGE, ["Anna Kestrel"])
    text = PASSAGE + " The bridge is 78 metres long."
    assert strip_answer(text, ["8"]) == PASSAGE


def test_strip_answer_refuses_what_is_too_short_to_keep_the_topic():
    assert strip_answer("Anna Kestrel built it. The bridge is old.", ["Anna Kestrel"]) is None
    assert len(strip_answer(PASSAGE, ["Anna Kestrel"]).split()) >= MIN_WORDS


def test_strip_answer_of_a_passage_without_the_answer_is_the_passage():
    assert strip_answer(PASSAGE, ["Boris Lund"]) == PASSAGE


def _check_twin(record: dict, twin: dict) -> None:
    i = record["answer_index"]
    assert twin["answers"] == [ABSTAIN] and twin["answerable"] is False and twin["answer_index"] is None
    assert twin["topical"] is True and twin["question"] == record["question"]
    # every other passage as it was, in the same order
    assert [p for j, p in enumerate(twin["contexts"]) if j != i] == [
        p for j, p in enumerate(record["contexts"]) if j != i
    ]
    # the answering passage: shorter, no answer left in any passage
    assert len(twin["contexts"][i]) < len(record["contexts"][i])
    assert not any(mentions(p, needles(record["answers"])) for p in twin["contexts"])


def test_synthetic_twins_keep_the_entity_in_every_layout():
    records = generate(60, 4, seed=3, domains=TRAIN_DOMAINS, hard=True, families="all")
    layouts = Counter()
    for record in records:
        twin = topical_twin(record)
        assert twin is not None  # a synthetic fact is stated once, so it always strips
        _check_twin(record, twin)
        assert record["entity"] in twin["contexts"][record["answer_index"]]
        layouts[record["layout"]] += 1
    assert set(layouts) == {"prose", "record", "news"}


def test_prose_twins_keep_the_entity_passage_without_the_asked_sentence():
    records = generate_prose(40, 3, seed=5, split="eval")
    twins = [(r, topical_twin(r)) for r in records]
    made = [(r, t) for r, t in twins if t is not None]
    assert len(made) >= 34  # about 15 in 16 strip cleanly
    for record, twin in made:
        _check_twin(record, twin)
        assert record["answers"][0] not in twin["contexts"][record["answer_index"]]


def test_the_mix_makes_an_exact_share_of_the_unanswerable_records_topical():
    plain = build_mix(200, seed=7, unanswerable=0.2, prose=0.3)
    mixed = build_mix(200, seed=7, unanswerable=0.2, prose=0.3, topical=0.5)
    assert len(mixed) == 200
    topical = [r for r in mixed if r.get("topical")]
    assert len(topical) == 20 and all(not r["answerable"] and r["answers"] == [ABSTAIN] for r in topical)
    assert {r["source"].split(":")[0] for r in topical} == {"synth", "prose"}
    # the answerable records are the same; only the chosen unanswerable slots changed
    assert [r for r in mixed if r["answerable"]] == [r for r in plain if r["answerable"]]
    assert sum(a != b for a, b in zip(plain, mixed)) == 20
    assert build_mix(200, seed=7, unanswerable=0.2, prose=0.3, topical=0.5) == mixed


def test_paired_twins_never_replace_a_topical_record():
    rows = build_mix(200, seed=8, unanswerable=0.2, paired=1.0, topical=0.5)
    assert sum(bool(r.get("topical")) for r in rows) == 20
    assert sum(bool(r.get("twin")) for r in rows) == 20


def test_the_mix_refuses_a_bad_topical_share():
    with pytest.raises(ValueError, match="topical"):
        build_mix(10, topical=1.5)


def test_eval_sets_hold_topical_twins_of_their_answerable_questions():
    sets = build_eval_sets(n=30, contexts=5, seed=4)
    unseen = {r["question"]: r for r in sets["synth-unseen"]}
    assert len(sets["synth-topical"]) == 30
    for twin in sets["synth-topical"]:
        _check_twin(unseen[twin["question"]], twin)
    prose = {r["question"] for r in sets["prose-doc"]}
    assert 24 <= len(sets["prose-topical-doc"]) <= 30
    assert all(t["question"] in prose and t["style"] == "document" for t in sets["prose-topical-doc"])


def test_paired_topical_twins_come_with_the_record_they_were_made_from():
    """With `paired`, each topical twin's partner is its answerable original: the same question over the
    same passages in the same layout, but for the answering passage, which the twin has stripped."""
    rows = build_mix(80, seed=105, unanswerable=0.5, topical=1.0, paired=1.0, doc_style=1.0, prose=0.5)
    kinds = Counter((r["source"].split(":")[0], r["answerable"]) for r in rows)
    assert kinds == {("prose", True): 30, ("prose", False): 30, ("synth", True): 10, ("synth", False): 10}
    pairs = 0
    for twin in (r for r in rows if r.get("topical")):
        partners = [
            r
            for r in rows
            if r["answerable"]
            and r["question"] == twin["question"]
            and len(r["contexts"]) == len(twin["contexts"])
            and sum(a != b for a, b in zip(r["contexts"], twin["contexts"])) == 1
        ]
        assert len(partners) == 1, twin["question"]
        original = partners[0]
        i = original["answer_index"]
        assert twin["contexts"][i] != original["contexts"][i]
        assert original.get("style") == twin.get("style")
        pairs += 1
    assert pairs == 40
