"""Plain-English questions over stdlib documentation (turborag_research/prose.py): the rules on hand-made
sentences, bad sentences refused, records whose one answering passage states the target, the held-out
split, and the mix and eval sets built with them."""

from collections import Counter

import pytest
from typer.testing import CliRunner

from turborag.cli import app
from turborag.eval.metrics import ABSTAIN, contains_answer
from turborag_research.mix import build_eval_sets, build_mix
from turborag_research.prose import RULES, ask, generate_prose, prose_stats, without_answer
from turborag_research.realtext import EVAL_MODULES, TRAIN_MODULES

runner = CliRunner()


@pytest.mark.parametrize(
    "sentence, question, span",
    [
        (
            "If k is not specified or is None, then k defaults to n.",
            "What happens in math.perm if k is not specified or is None?",
            "then k defaults to n",
        ),
        (
            "A right shift by n bits is defined as floor division by pow(2,n).",
            "How is a right shift by n bits defined?",
            "as floor division by pow(2,n)",
        ),
        (
            "An OverflowError is raised if the integer is not representable.",
            "In math.perm, when is an OverflowError raised?",
            "if the integer is not representable",
        ),
        (
            "The result is returned as a bytes object.",
            "In math.perm, how is the result returned?",
            "as a bytes object",
        ),
        (
            "A Counter is a dict subclass for counting hashable objects.",
            "In math.perm, what is a Counter?",
            "a dict subclass for counting hashable objects",
        ),
        (
            "The optional exitmsg argument specifies the exit message printed when exiting.",
            "What does the optional exitmsg argument specify?",
            "the exit message printed when exiting",
        ),
        (
            "The target path of the new link may be absolute or relative.",
            "May the target path of the new link be absolute or relative?",
            None,
        ),
        (
            "There is no way to quote meta-characters.",
            "In math.perm, is there any way to quote meta-characters?",
            None,
        ),
        (
            "The write function is used for writing out the data stream as text.",
            "In math.perm, what is the write function used for?",
            "for writing out the data stream as text",
        ),
    ],
)
def test_each_rule_asks_about_its_sentence(sentence, question, span):
    asked = ask(sentence, "math.perm")
    assert asked is not None and asked.question == question
    assert asked.sentence == sentence and asked.span == span
    assert asked.rule in RULES


@pytest.mark.parametrize(
    "sentence",
    [
        "If they are unavailable, using them will raise a NotImplementedError.",  # whose "they"?
        "If the items are not 1, 2, 4, or 8 bytes in size, RuntimeError is raised.",  # cut inside a list
        "The IncrementalDecoder remembers the state of the process between calls to decode().",
        "This function takes an InputSource and an optional base URL.",  # "this" needs the sentence before
        "The counter can never go below zero; when acquire() finds it zero, it blocks.",
        "Return the middle value.",  # no rule: realtext.py asks "What does ... return?"
        "Short one.",
        "The `flag` argument is used for nothing at all here.",  # markup
        " ".join(["The value is a word"] + ["and more"] * 20) + ".",  # too long to answer whole
        "",
    ],
)
def test_sentences_no_rule_should_ask_are_refused(sentence):
    assert ask(sentence, "x.y") is None


@pytest.fixture(scope="module")
def records():
    return generate_prose(60, 6, seed=3)


def test_records_have_one_answering_passage(records):
    assert generate_prose(60, 6, seed=3) == records
    assert generate_prose(5, 6, seed=4) != records[:5]
    assert Counter(r["kind"] for r in records).keys() <= set(RULES)
    assert len({r["kind"] for r in records}) >= 4  # rules drawn evenly, not mostly "conditional"
    for r in records:
        assert r["answerable"] and len(r["contexts"]) == 6 and r["source"].startswith("prose:")
        gold = r["contexts"][r["answer_index"]]
        assert r["answers"][0] in gold and r["answers"][0].endswith((".", "?", "!"))
        for i, passage in enumerate(r["contexts"]):
            if i != r["answer_index"]:
                assert not contains_answer(passage, r["answers"])
    train_packages = {m.split(".")[0] for m in TRAIN_MODULES}
    assert all(r["source"].removeprefix("prose:").split(".")[0] in train_packages for r in records)


def test_unanswerable_records_lose_only_the_answering_passage(records):
    r = records[0]
    twin = without_answer(r)
    assert twin["answers"] == [ABSTAIN] and twin["answer_index"] is None and not twin["answerable"]
    assert twin["question"] == r["question"]
    assert twin["contexts"] == [c for i, c in enumerate(r["contexts"]) if i != r["answer_index"]]
    mixed = generate_prose(20, 4, seed=5, unanswerable=0.25)
    missing = [r for r in mixed if not r["answerable"]]
    assert len(missing) == 5 and all(len(r["contexts"]) == 4 and r["answers"] == [ABSTAIN] for r in missing)


def test_eval_split_is_held_out():
    eval_packages = {m.split(".")[0] for m in EVAL_MODULES}
    rows = generate_prose(30, 3, seed=1, split="eval")
    assert all(r["source"].removeprefix("prose:").split(".")[0] in eval_packages for r in rows)
    stats = prose_stats("eval")
    assert sum(stats.values()) >= 150 and set(stats) <= set(RULES)


def test_bad_arguments_are_refused():
    for kwargs, match in [
        ({"n": 0, "contexts": 3}, "n must"),
        ({"n": 1, "contexts": 0}, "contexts"),
        ({"n": 1, "contexts": 2, "split": "test"}, "split"),
        ({"n": 1, "contexts": 2, "unanswerable": 2.0}, "unanswerable"),
    ]:
        with pytest.raises(ValueError, match=match):
            generate_prose(**kwargs)
    with pytest.raises(ValueError, match="prose"):
        build_mix(10, prose=1.5)


def test_mix_with_prose_has_exact_shares_and_twins():
    assert build_mix(60, seed=2, prose=0.0) == build_mix(60, seed=2)
    rows = build_mix(200, seed=2, unanswerable=0.2, prose=0.5, paired=1.0, doc_style=0.5)
    parts = Counter((r["source"].split(":")[0], r["answerable"]) for r in rows)
    assert parts[("prose", True)] == 80 and parts[("prose", False)] == 20
    assert parts[("synth", True)] + parts[("stdlib", True)] == 80
    answerable = {r["question"]: r for r in rows if r["answerable"]}
    for twin in (r for r in rows if r["source"].startswith("prose:") and not r["answerable"]):
        assert twin.get("twin") and twin["question"] in answerable  # the missing passage is the only cue


def test_eval_sets_hold_prose_and_its_twins():
    sets = build_eval_sets(n=20, contexts=5, seed=1)
    prose, twins = sets["prose-doc"], sets["prose-unanswerable-doc"]
    assert len(prose) == len(twins) == 20
    for answered, twin in zip(prose, twins):
        assert answered["answerable"] and len(answered["contexts"]) == 5 and answered["style"] == "document"
        assert twin["question"] == answered["question"] and len(twin["contexts"]) == 4
        assert twin["answers"] == [ABSTAIN]


def test_cli_mix_takes_prose(tmp_path):
    out = tmp_path / "mix.jsonl"
    result = runner.invoke(app, ["data", "mix", "--n", "20", "--prose", "0.5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    # round(17 / 2) = 8 answerable, round(3 / 2) = 2 unanswerable
    assert sum('"prose:' in line for line in out.read_text().splitlines()) == 10
    result = runner.invoke(app, ["data", "mix", "--n", "20", "--prose", "2", "--out", str(out)])
    assert result.exit_code != 0
