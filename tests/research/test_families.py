"""Template families of the synthetic records (families.py, synth.py): every wording and layout renders for
every template, the gold passage alone states the answer, and the seen and unseen sets keep to their
families."""

import random
import re
from collections import Counter

import pytest

from turborag.eval.metrics import contains_answer
from turborag_research import families as fam
from turborag_research import synth
from turborag_research.synth import generate

# The imperative wording is the one built from a template's attribute (and unit) rather than from its own
# sentences, so it is pinned here for every template: a new template must be read once in this wording.
IMPERATIVES = {
    "Who founded {e}?": "Give the founder of {e}.",
    "In which city is {e} headquartered?": "Give the headquarters city of {e}.",
    "In what year was {e} founded?": "Give the founding year of {e}.",
    "What is the flagship product of {e}?": "Give the flagship product of {e}.",
    "Who is the mayor of {e}?": "Give the mayor of {e}.",
    "Which river flows through {e}?": "Give the main river of {e}.",
    "What is the population of {e}?": "Give the population of {e}.",
    "What is the best-known landmark in {e}?": "Give the best-known landmark of {e}.",
    "What stone are the old houses of {e} built from?": "Give the building stone of {e}.",
    "Who first synthesized {e}?": "Give the discoverer of {e}.",
    "At what temperature, in degrees Celsius, does {e} melt?": (
        "Give the melting point of {e}, in degrees Celsius."
    ),
    "What color are crystals of {e}?": "Give the crystal color of {e}.",
    "In what year was {e} first isolated?": "Give the year of first isolation of {e}.",
    "Who is the lead singer of the {e}?": "Give the lead singer of the {e}.",
    "What was the title of the debut album by the {e}?": "Give the debut album of the {e}.",
    "In which city were the {e} formed?": "Give the hometown of the {e}.",
    "Who is the head coach of the {e}?": "Give the head coach of the {e}.",
    "What is the name of the home stadium of the {e}?": "Give the home stadium of the {e}.",
    "How many league titles have the {e} won?": "Give the number of league titles of the {e}.",
    "In what year were the {e} founded?": "Give the founding year of the {e}.",
    "Who discovered the exoplanet {e}?": "Give the discoverer of {e}.",
    "Which star does {e} orbit?": "Give the host star of {e}.",
    "How many days does {e} take to complete one orbit?": "Give the orbital period of {e}, in days.",
    "In which town did {e} originate?": "Give the town of origin of {e}.",
    "What is the main ingredient of {e}?": "Give the main ingredient of {e}.",
    "Which chef created {e}?": "Give the creator of {e}.",
    "For how many minutes is {e} traditionally cooked?": "Give the cooking time of {e}, in minutes.",
    "In what year was the {e} signed?": "Give the year of signing of the {e}.",
    "Who negotiated the {e}?": "Give the negotiator of the {e}.",
    "Which river became the border under the {e}?": "Give the border river of the {e}.",
    "What was the seal of the {e} made of?": "Give the seal material of the {e}.",
    "Who first described the {e}?": "Give the first describer of the {e}.",
    "On which island is the {e} found?": "Give the home island of the {e}.",
    "What color is the {e}?": "Give the color of the {e}.",
    "How many years does the {e} typically live?": "Give the typical lifespan of the {e}, in years.",
    "Who directed {e}?": "Give the director of {e}.",
    "In what year was {e} released?": "Give the release year of {e}.",
    "Who played the lead role in {e}?": "Give the lead actor of {e}.",
    "In which city was {e} filmed?": "Give the filming location of {e}.",
}
_TEMPLATES = [(d, t) for d in synth._DOMAIN_LIST for t in d.templates]
_ALL = {"wording": fam.WORDINGS, "layout": fam.LAYOUTS, "answer_type": fam.ANSWER_TYPES}
_SEEN = {"wording": fam.SEEN.wordings, "layout": fam.SEEN.layouts, "answer_type": fam.SEEN.answer_types}
_WEEKDAY = re.compile(r"^(Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day, from our correspondent\. ")


def _layout(passage: str) -> str:
    """Which layout a passage is in, from its form alone."""
    if "\n" in passage:
        return "record"
    return "news" if _WEEKDAY.match(passage) else "prose"


def test_answer_types_are_the_value_kinds():
    assert set(fam.ANSWER_TYPES) == set(synth._VALUE_KINDS)
    assert {t.answer_type for _, t in _TEMPLATES} == set(fam.ANSWER_TYPES)
    held_out = (fam.HELD_OUT_WORDINGS, fam.HELD_OUT_LAYOUTS, fam.HELD_OUT_ANSWER_TYPES)
    for held, values in zip(held_out, (fam.WORDINGS, fam.LAYOUTS, fam.ANSWER_TYPES)):
        assert set(held) < set(values)  # something of every axis is held out, and something is left
    # training keeps at least two wordings and layouts, and every domain keeps a template
    assert len(fam.SEEN.wordings) >= 2 and len(fam.SEEN.layouts) >= 2
    assert all(any(t.answer_type in fam.SEEN.answer_types for t in d.templates) for d in synth._DOMAIN_LIST)


def test_every_wording_reads_for_every_template():
    assert {t.question for _, t in _TEMPLATES} == set(IMPERATIVES)
    for _, t in _TEMPLATES:
        entity = "Quorvik Dynamics"
        direct = synth._question(t, "direct", entity)
        assert direct == t.question.format(e=entity)
        assert synth._question(t, "imperative", "{e}") == IMPERATIVES[t.question]
        context = synth._question(t, "context", entity)
        assert context == f"According to the passages, {direct[0].lower()}{direct[1:]}"
        assert direct.split()[0] in {"Who", "What", "Which", "In", "At", "How", "On", "For"}  # no name first
        gap = synth._question(t, "gap", entity)
        assert gap.startswith("Fill in the blank: ") and gap.count("___") == 1 and gap.endswith(".")
        for wording in fam.WORDINGS:
            q = synth._question(t, wording, entity)
            assert entity in q and "{" not in q and "  " not in q and q[0].isupper(), (wording, q)


@pytest.mark.parametrize("layout", fam.LAYOUTS)
def test_every_layout_renders_for_every_template(layout):
    rng = random.Random(0)
    for domain, t in _TEMPLATES:
        for _ in range(5):
            entity, value = domain.make_entity(rng), t.make_value(rng)
            passage, fact = synth._passage_and_fact(rng, domain, t, entity, value, layout)
            assert _layout(passage) == layout
            assert value.text in fact and contains_answer(passage, value.answers)
            assert (fact in passage) != (layout == "record")  # a sheet's line is said as a sentence
            assert entity in passage and "{" not in passage and "  " not in passage
            words = len(passage.split())
            if layout == "record":
                lines = passage.split("\n")
                assert lines[0] == entity and lines[-1].startswith("Notes: ")
                # one line per attribute, but a held-out answer type's only on a sheet asked about it
                held = [u for u in domain.templates if u.answer_type in fam.HELD_OUT_ANSWER_TYPES]
                held = [u for u in held if u is not t]
                assert len(lines) == len(domain.templates) - len(held) + 2
                heads = {line.split(":")[0] for line in lines}
                assert not heads & {u.attribute.capitalize() for u in held}
                unit = f" {t.unit}" if t.unit else ""
                assert f"{t.attribute[0].upper()}{t.attribute[1:]}: {value.text}{unit}" in lines
                assert (
                    fact == f"The {t.attribute} of {synth._entity_phrase(t, entity)} is {value.text}{unit}."
                )
                assert sum(contains_answer(line, value.answers) for line in lines[1:-1]) == 1
            elif layout == "news":
                assert 80 <= words <= 150, passage
                at = passage.index(fact)  # mid-paragraph: fillers before and after it
                fillers = [synth._sentence(f, e=entity) for f in domain.fillers]
                assert any(f in passage[:at] for f in fillers) and any(f in passage[at:] for f in fillers)
            else:
                assert 40 <= words <= 90


@pytest.mark.parametrize("families", ["all", "seen", "unseen"])
def test_gold_states_the_answer_and_distractors_do_not(families):
    records = generate(150, 8, seed=3, hard=True, families=families)
    for r in records:
        assert r["layout"] in fam.LAYOUTS and r["wording"] in fam.WORDINGS
        assert r["answer_type"] in fam.ANSWER_TYPES and r["entity"] and r["answerable"] is True
        gold = r["contexts"][r["answer_index"]]
        assert contains_answer(gold, r["answers"]) and r["entity"] in gold
        for i, passage in enumerate(r["contexts"]):
            assert _layout(passage) == r["layout"]  # distractors share the layout: layout is no cue
            if i != r["answer_index"]:
                assert not contains_answer(passage, r["answers"])
                assert not contains_answer(passage, [r["entity"]])
        assert len(set(r["contexts"])) == len(r["contexts"])


def test_unanswerable_and_sentence_answers_keep_their_families():
    for r in generate(40, 5, seed=2, hard=True, unanswerable=1.0, families="all"):
        assert r["answerable"] is False and r["answer_index"] is None and set(fam.AXES) <= set(r)
        assert not any(contains_answer(p, [r["entity"]]) for p in r["contexts"])
        assert all(_layout(p) == r["layout"] for p in r["contexts"])
    for r in generate(40, 5, seed=2, sentence_answers=True, families="all"):
        gold = r["contexts"][r["answer_index"]]
        assert (r["answers"][0] in gold) != (r["layout"] == "record")
        assert all(a in r["answers"][0] and a in gold for a in r["answers"][1:])


def test_seen_families_have_no_held_out_part():
    records = generate(300, 3, seed=5, families="seen")
    assert not any(fam.held_out_parts(r) for r in records)
    for axis in fam.AXES:  # every seen part is drawn
        assert {r[axis] for r in records} == set(_SEEN[axis]), axis


def test_unseen_families_spread_over_the_held_out_axes():
    records = generate(70, 3, seed=5, families="unseen")
    parts = Counter(fam.held_out_parts(r) for r in records)
    assert len(parts) == 7 and set(parts.values()) == {10}  # every combination of axes, evenly
    for r in records:
        for axis in fam.AXES:  # the parts that are not held out are seen ones
            held = axis in fam.held_out_parts(r)
            assert (r[axis] in _SEEN[axis]) != held
    assert all(fam.held_out_parts(r) for r in generate(5, 3, seed=1, families="unseen"))
    assert len({fam.held_out_parts(generate(1, 3, seed=s, families="unseen")[0]) for s in range(40)}) == 7


def test_all_families_cover_everything():
    records = generate(400, 2, seed=1, families="all")
    for axis in fam.AXES:
        assert {r[axis] for r in records} == set(_ALL[axis]), axis


def test_legacy_is_the_default_and_carries_no_family():
    assert generate(10, 4, seed=9) == generate(10, 4, seed=9, families="legacy")
    assert not any(set(fam.AXES) & set(r) for r in generate(10, 4, seed=9, hard=True))


@pytest.mark.parametrize("families", fam.FAMILY_SETS)
def test_deterministic_for_a_seed(families):
    assert generate(12, 4, seed=3, families=families) == generate(12, 4, seed=3, families=families)
    assert generate(12, 4, seed=3, families=families) != generate(12, 4, seed=4, families=families)


def test_bad_families_are_rejected():
    with pytest.raises(ValueError, match="families must be one of legacy, all, seen, unseen, got 'held'"):
        generate(3, 2, families="held")
    with pytest.raises(ValueError, match="no template of domains film, astronomy asks for a material"):
        generate(7, 2, domains=["film", "astronomy"], families="unseen")
    assert {r["domain"] for r in generate(7, 2, domains=["film", "city"], families="unseen")} <= {
        "film",
        "city",
    }
