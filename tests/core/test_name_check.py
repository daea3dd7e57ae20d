"""The name check (core/grounding.py): which names a question must find in its passages, when a passage
mentions one, and that the engine declines exactly when one is missing. Tiny models in fp32."""

from __future__ import annotations

import json
import random
import string

import pytest

from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.grounding import missing_names, question_names
from turborag.core.model import name_check
from turborag.core.options import EngineOptions
from turborag.store.kv_store import KVStore

PASSAGES = [
    "Veltrano Dynamics was founded in 1911 by Ismena Throll in the city of Quorvik.",
    "collections.deque.pop(...)\n\nRemove and return the rightmost element.",
    "class queue.PriorityQueue(maxsize=0)\n\nA priority queue; os.path.join joins paths.",
]


@pytest.mark.parametrize(
    ("question", "names"),
    [
        ("Who founded Veltrano Dynamics?", ["Veltrano Dynamics"]),
        ("How many days does Ninol Tertius take to complete one orbit?", ["Ninol Tertius"]),
        ("In which city was The Tilso Protocol filmed?", ["The Tilso Protocol"]),
        ("Which exception does `collections.ChainMap.pop` raise?", ["collections.ChainMap.pop"]),
        ("What does `json.loads()` return, e.g. for a list?", ["json.loads"]),
        (
            "What is the default of the `maxsize` parameter of queue.PriorityQueue?",
            ["maxsize", "queue.PriorityQueue"],
        ),
        ("What is Ninol Tertius's mass?", ["Ninol Tertius"]),
        (
            "Ninol Tertius orbits which star?",
            [],
        ),  # the first word is the question's own: "Tertius" alone is left
        ("Which values are false in Boolean operations?", []),  # one capitalized word: not checked
        ("What does the expression `x and y` evaluate first?", []),  # not an identifier
        ("What does the break statement do?", []),
    ],
)
def test_question_names(question, names):
    assert question_names(question) == names


def test_a_near_namesake_does_not_count_as_a_mention():
    assert missing_names("Who founded Veltreno Dynamics?", PASSAGES) == ["Veltreno Dynamics"]
    assert missing_names("Which exception does `collections.ChainMap.pop` raise?", PASSAGES) == [
        "collections.ChainMap.pop"
    ]
    assert missing_names("What does `deque.popleft` do?", PASSAGES) == ["deque.popleft"]
    assert missing_names("Who founded Veltrano Dyn?", ["Veltrano Dynamics"]) == [
        "Veltrano Dyn"
    ]  # whole words


def test_mentions_ignore_case_and_spacing_and_a_dropped_package():
    assert missing_names("Who founded VELTRANO  DYNAMICS?", PASSAGES) == []
    assert missing_names("Who founded Veltrano Dynamics Inc?", PASSAGES) == ["Veltrano Dynamics Inc"]
    assert missing_names("Who founded Veltrano Dynamics?", ["founded by\nVeltrano\n  Dynamics"]) == []
    assert missing_names("What does `collections.deque.pop` return?", PASSAGES) == []
    assert missing_names("What does `a.collections.deque.pop` return?", PASSAGES) == []  # deque.pop is there
    assert missing_names("What is the default `maxsize` of `queue.PriorityQueue`?", PASSAGES) == []


def test_any_question_mentions_its_own_names():
    """Fuzz: random questions of words, capitals, dots, backticks and punctuation never fail, every missing
    name is one of the question's names, and a question is always grounded in a passage that quotes it."""
    rng = random.Random(1)
    pieces = "Veltrano Minor of the The ` os.path .join () 's ' - e.g. A1 x_y".split()
    for _ in range(20000):
        words = [rng.choice(pieces + ["".join(rng.choices(string.printable, k=rng.randint(1, 6)))])
                 for _ in range(rng.randint(0, 14))]  # fmt: skip
        q = rng.choice([" ", "", "\n"]).join(words)
        missing = missing_names(q, PASSAGES)
        assert set(missing) <= set(question_names(q))
        assert missing_names(q, [q]) == [], q


def _engine(lm, tmp_path, check):
    engine = Engine(lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(name_check=check))
    engine.stop_ids = set()  # random weights may pick EOS first: decode every request its full length
    return engine


@pytest.mark.parametrize("tiny_lm", ["llama", "gemma3"], indirect=True)
def test_engine_declines_exactly_when_a_name_is_missing(tiny_lm, tmp_path):
    plain = _engine(tiny_lm, tmp_path / "a", False)
    checked = _engine(tiny_lm, tmp_path / "b", True)
    params = SamplingParams(max_new_tokens=64)
    for mode in ("full", "turbo"):
        grounded = "Who founded Veltrano Dynamics?"
        a, b = (
            plain.answer(grounded, PASSAGES, mode, params),
            checked.answer(grounded, PASSAGES, mode, params),
        )
        assert a.token_ids == b.token_ids and b.missing_names == []
        absent = "Who founded Veltreno Dynamics?"
        declined = checked.answer(absent, PASSAGES, mode, params)
        assert declined.token_ids == checked.abstain_ids and declined.missing_names == ["Veltreno Dynamics"]
        assert declined.finish_reason == "stop" and declined.ttft_s > 0 and declined.prompt_tokens > 0
        assert plain.answer(absent, PASSAGES, mode, params).token_ids != checked.abstain_ids
        # an answer asked to be longer than the reply is the model's, and names no missing name
        longer = SamplingParams(max_new_tokens=64, min_tokens=len(checked.abstain_ids) + 1)
        answered = checked.answer(absent, PASSAGES, mode, longer)
        assert answered.token_ids == plain.answer(absent, PASSAGES, mode, longer).token_ids
        assert answered.missing_names == []


def test_name_check_is_read_from_the_fine_tune_record(tmp_path):
    assert name_check(tmp_path) is False  # no record
    (tmp_path / "turborag_finetune.json").write_text(json.dumps({"cache_aware": True}))
    assert name_check(tmp_path) is False
    (tmp_path / "turborag_finetune.json").write_text(json.dumps({"name_check": True}))
    assert name_check(tmp_path) is True


@pytest.mark.parametrize(
    ("question", "names"),
    [
        ("What did Ismena Throll and Vel Arno sign?", ["Ismena Throll", "Vel Arno"]),  # two names
        ("What is Quorvik's Night Market called?", ["Night Market"]),  # a possessive ends a name
        ("What is Quorvik\u2019s Night Market called?", ["Night Market"]),
        ("When did Veltrano's AI open?", []),  # two single words: nothing to check
        ("Who made the Tilso Protocol-inspired game?", ["Tilso Protocol"]),  # a lower-case tail is no name
        ("When does Ostrel Full-Self Driving launch?", ["Ostrel Full-Self Driving"]),
        ("Fill in the blank: Crystals of Quorvine are ___.", []),  # a sentence's first word, after a colon
        ("Answer this. Ninol Tertius orbits which star?", []),
    ],
)
def test_question_names_read_news_style_english(question, names):
    assert question_names(question) == names


def test_mentions_take_plurals_and_hyphens_as_english_does():
    assert missing_names("Who won the Quorvik Award?", ["She won two Quorvik Awards."]) == []
    assert missing_names("Which Quorvik Awards did she win?", ["She won the Quorvik Award."]) == []
    assert missing_names("When does Ostrel Full-Self Driving launch?", ["Ostrel Full Self-Driving is"]) == []
    en_dash = ["Ostrel Full\u2013Self Driving"]
    assert missing_names("When does Ostrel Full-Self Driving launch?", en_dash) == []
    # near-namesakes stay missing: a letter changed is not a plural, nor is a longer word
    assert missing_names("Who won the Quorvik Award?", ["the Quorvek Award"]) == ["Quorvik Award"]
    assert missing_names("Who won the Quorvik Award?", ["the Quorvik Awardee"]) == ["Quorvik Award"]
    assert missing_names("Who founded Veltrano Dyn?", ["Veltrano Dynamics"]) == ["Veltrano Dyn"]
    # code stays exact: no plural of an identifier
    assert missing_names("What does `deque.pop` do?", ["deque.pops"]) == ["deque.pop"]
