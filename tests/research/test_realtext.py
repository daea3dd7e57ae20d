"""Real-text QA over the standard library's docstrings: answers are spans of the gold passage only, the
train and eval modules are disjoint, unanswerable questions lose their entity's passage, and the language
reference (pydoc_data) is never touched."""

import hashlib
import json
import re
import subprocess
import sys
from collections import Counter

import pytest
from typer.testing import CliRunner

from turborag.cli import app
from turborag.eval.metrics import ABSTAIN, contains_answer
from turborag_research import realtext
from turborag_research.realtext import (
    EVAL_MODULES,
    KINDS,
    TRAIN_MODULES,
    generate_realtext,
    split_of,
    split_stats,
)

runner = CliRunner()
KEYS = {"question", "answers", "contexts", "source", "kind", "entity", "answer_index", "answerable"}


@pytest.fixture(scope="module")
def records():
    return generate_realtext(400, 8, seed=3, unanswerable=0.1)


def _module(passage: str) -> str:
    """The top-level package of a passage, from its header line ("class json.JSONDecoder(...)")."""
    return passage.split("\n", 1)[0].removeprefix("class ").split(".", 1)[0]


def _header_is(passage: str, entity: str) -> bool:
    header = passage.split("\n", 1)[0].removeprefix("class ")
    return re.match(re.escape(entity) + r"(\(|$)", header) is not None


def test_deterministic_for_a_seed():
    assert generate_realtext(30, 6, seed=5, unanswerable=0.2) == generate_realtext(
        30, 6, seed=5, unanswerable=0.2
    )
    assert generate_realtext(30, 6, seed=5) != generate_realtext(30, 6, seed=6)


def test_shapes(records):
    assert len(records) == 400
    assert sum(not r["answerable"] for r in records) == 40  # exactly round(n * unanswerable)
    for r in records:
        assert set(r) == KEYS
        assert len(r["contexts"]) == 8 and len(set(r["contexts"])) == 8
        assert r["kind"] in KINDS and r["source"].startswith("stdlib:")
        assert r["entity"].startswith(r["source"].removeprefix("stdlib:") + ".")
        assert r["question"].endswith("?") and f"`{r['entity']}`" in r["question"]
        if r["answerable"]:
            assert 0 <= r["answer_index"] < 8
        else:
            assert r["answer_index"] is None and r["answers"] == [ABSTAIN]
    assert set(Counter(r["kind"] for r in records)) == set(KINDS)


def test_answers_are_spans_of_the_gold_passage_and_of_no_distractor(records):
    for r in (r for r in records if r["answerable"]):
        gold = r["contexts"][r["answer_index"]]
        assert _header_is(gold, r["entity"])
        # A default question's first answer is the sentence stating it; every other answer is a literal span.
        spans = r["answers"][1:] if r["kind"] == "default" else r["answers"]
        assert spans and all(span in gold for span in spans), r
        for i, passage in enumerate(r["contexts"]):
            if i != r["answer_index"]:
                assert not contains_answer(passage, r["answers"]), (r["question"], passage)
                assert not any(span.lower() in passage.lower() for span in spans)


def test_answers_have_natural_length(records):
    for r in (r for r in records if r["answerable"]):
        assert 4 <= len(r["answers"][0].split()) <= 30, r["answers"]
        if r["kind"] == "default":
            param = re.search(r"`(\w+)` parameter", r["question"])[1]
            value = r["answers"][1]
            assert r["answers"][0] == f"The default value of `{param}` is {value}."
            header = r["contexts"][r["answer_index"]].split("\n", 1)[0]
            assert re.search(rf"\b{param}(: [^=]+ )?=( )?{re.escape(value)}[,)]", header), header
        if r["kind"] == "does":
            body = r["contexts"][r["answer_index"]].split("\n", 1)[1]
            assert body.startswith(r["answers"][0])  # the first sentence, as written
        if r["kind"] == "returns":
            assert r["answers"][0].startswith("Return")
        if r["kind"] == "raises":
            assert len(r["answers"]) == 2 and r["answers"][1] in r["answers"][0]


def test_passages_look_like_documentation_chunks(records):
    for r in records:
        for passage in r["contexts"]:
            header, body = passage.split("\n", 1)
            assert "." in header and "\n" not in body and ">>>" not in body
            assert 6 <= len(body.split()) <= 260


def test_distractors_start_with_the_entitys_own_module(records):
    same = [
        sum(_module(p) == r["entity"].split(".")[0] for p in r["contexts"]) - r["answerable"] for r in records
    ]
    assert sum(n >= 1 for n in same) > 0.8 * len(records)


def test_unanswerable_records_leave_out_the_entity_but_keep_look_alikes(records):
    unanswerable = [r for r in records if not r["answerable"]]
    for r in unanswerable:
        for passage in r["contexts"]:
            assert not _header_is(passage, r["entity"])
            assert r["entity"].lower() not in passage.lower()
    same_module = [any(_module(p) == r["entity"].split(".")[0] for p in r["contexts"]) for r in unanswerable]
    assert sum(same_module) > 0.8 * len(unanswerable)


def test_train_and_eval_modules_are_disjoint_and_fixed():
    assert not set(TRAIN_MODULES) & set(EVAL_MODULES)
    assert 0.12 < len(EVAL_MODULES) / (len(TRAIN_MODULES) + len(EVAL_MODULES)) < 0.3
    assert all(split_of(m) == "eval" for m in EVAL_MODULES)
    assert all(split_of(m) == "train" for m in TRAIN_MODULES)
    # a package and its submodules go together; cProfile goes with profile (they share docstrings)
    for module in TRAIN_MODULES + EVAL_MODULES:
        assert split_of(module) == split_of(module.split(".")[0])
    assert split_of("cProfile") == split_of("profile")
    # the split is a pure function of the name: pinned values catch an accidental change of the hash
    assert split_of("json") == "eval" and split_of("textwrap") == "train"


@pytest.mark.parametrize(
    "name", ["pydoc_data", "pydoc", "this", "antigravity", "idlelib", "tkinter", "turtle", "lib2to3", "test"]
)
def test_reserved_and_side_effect_modules_are_never_candidates(name):
    for module in TRAIN_MODULES + EVAL_MODULES:
        assert module != name and not module.startswith(name + ".")


def test_eval_split_only_uses_eval_modules():
    for r in generate_realtext(60, 10, seed=1, split="eval", unanswerable=0.3):
        assert r["entity"].split(".")[0] in {m.split(".")[0] for m in EVAL_MODULES}
        assert all(split_of(_module(p)) == "eval" for p in r["contexts"])
    for r in generate_realtext(60, 10, seed=1, split="train"):
        assert all(split_of(_module(p)) == "train" for p in r["contexts"])


def test_split_stats_are_large_enough_for_the_eval_set():
    stats = split_stats()
    assert stats["train"]["entities"] > 1000 and stats["eval"]["entities"] > 150
    for split in ("train", "eval"):
        assert all(stats[split][f"{kind}_questions"] > 10 for kind in KINDS)


def _digest(records: list[dict]) -> str:
    return hashlib.sha256(json.dumps(records).encode()).hexdigest()


def test_generation_imports_neither_pydoc_data_nor_torch_and_ignores_import_history():
    """A fresh process imports nothing reserved or noisy, and gets the records that this process (which
    has imported torch, transformers and much more) gets: the output does not depend on import history."""
    code = (
        "import hashlib, json, sys\n"
        "from turborag_research.realtext import generate_realtext\n"
        "records = generate_realtext(50, 8, seed=0, unanswerable=0.2)\n"
        "records += generate_realtext(50, 8, seed=0, split='eval', unanswerable=0.2)\n"
        "bad = {'pydoc_data', 'torch', 'this', 'antigravity', 'tkinter', 'turtle', 'idlelib', 'lib2to3'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bad))\n"
        "print(hashlib.sha256(json.dumps(records).encode()).hexdigest())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    imported, digest = out.stdout.strip().splitlines()
    assert imported == "[]", out.stdout + out.stderr
    import concurrent.futures

    concurrent.futures.ThreadPoolExecutor  # noqa: B018 - caches the lazy attribute in the module's globals
    here = generate_realtext(50, 8, seed=0, unanswerable=0.2)
    here += generate_realtext(50, 8, seed=0, split="eval", unanswerable=0.2)
    assert digest == _digest(here)


@pytest.mark.parametrize(
    ("sentence", "tail", "exception"),
    [
        (
            "Raise ValueError if the requested cb_type is not supported.",
            " if the requested cb_type is not supported",
            "ValueError",
        ),
        ("If the key is missing, a KeyError is raised.", " if the key is missing", "KeyError"),
        (
            "Raises: CancelledError: If the future was cancelled.",
            " if the future was cancelled",
            "CancelledError",
        ),
        ("Return the handler or raise a LookupError.", ", according to its documentation", "LookupError"),
    ],
)
def test_raise_questions(sentence, tail, exception):
    assert realtext._raise_questions([sentence]) == ((tail, sentence, exception),)


@pytest.mark.parametrize(
    "sentence",
    [
        "It is returned instead of raising StopIteration.",
        "Closing the file does *not* raise OSError here.",
        "Both ValueError and TypeError are raised on bad input.",  # two exceptions: ambiguous
        "The ValueError class is documented elsewhere, raise nothing.",  # not the thing raised
    ],
)
def test_no_raise_question_from_negated_or_ambiguous_sentences(sentence):
    assert realtext._raise_questions([sentence]) == ()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (70, "70"),
        ("strict", "'strict'"),
        (None, "None"),
        ("", None),
        (",", None),
        ("%Y-%m", None),
        (b"x", None),
    ],
)
def test_clean_defaults(value, expected):
    assert realtext._clean_default(value) == expected


def test_clean_default_skips_object_reprs():
    assert realtext._clean_default(object()) is None
    assert realtext._clean_default(list(range(50))) is None


def test_paragraphs_flatten_clinic_parameter_lists_and_drop_doctests():
    doc = (
        "Perform a stat call.\n\n  path\n    Path to be examined.\n\n>>> stat('x')\n1\n\nSummary without stop"
    )
    assert realtext._paragraphs(doc) == [
        "Perform a stat call.",
        "path: Path to be examined.",
        "Summary without stop.",
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 0, "contexts": 3},
        {"n": 3, "contexts": 0},
        {"n": 3, "contexts": 3, "split": "test"},
        {"n": 3, "contexts": 3, "unanswerable": 1.5},
    ],
)
def test_bad_arguments_raise(kwargs):
    with pytest.raises(ValueError):
        generate_realtext(**kwargs)


def test_realtext_command(env):
    out = env / "r.jsonl"
    args = ["data", "realtext", "--n", "12", "--contexts", "4", "--split", "eval", "--unanswerable", "0.25"]
    r = runner.invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12 and all(len(row["contexts"]) == 4 for row in rows)
    assert sum(not row["answerable"] for row in rows) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--split", "test"], "error: --split must be train or eval, got 'test'"),
        (["--unanswerable", "2"], "error: --unanswerable must be a fraction from 0 to 1, got 2.0"),
    ],
)
def test_realtext_command_rejects_bad_input_in_one_line(env, args, message):
    r = runner.invoke(app, ["data", "realtext", "--out", str(env / "r.jsonl"), *args])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [message]
    assert not (env / "r.jsonl").exists()
