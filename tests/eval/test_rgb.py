"""The RGB builder: RGB's sampling rules, answer flattening, en_none's leak check, the files, the CLI.

Every test but the last runs on a small en.json written here with made-up text (RGB's own text is never
copied into this repository). The last reads optional external data: the reference files of the workplace,
when they are present.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from turborag.cli.rgb import rgb as rgb_command
from turborag.eval import rgb
from turborag.eval.evaluate import load_examples

runner = CliRunner()
cli = typer.Typer()
cli.command()(rgb_command)


def _row(i: int, answer, n_pos: int, n_neg: int, word: str, leak: str | None = None) -> dict:
    """One made-up RGB line: the positives name `word`, the negatives do not (unless `leak` is put in)."""
    negative = [f"Q{i} negative {j}: the harbour council met again." for j in range(n_neg)]
    if leak:
        negative[-1] += f" Some say {leak}."
    return {
        "id": i,
        "query": f"Question {i}: who won the Glimmer Cup?",
        "answer": answer,
        "positive": [f"Q{i} positive {j}: {word} won the Glimmer Cup." for j in range(n_pos)],
        "negative": negative,
    }


ROWS = [
    _row(0, [["Zorblat", "zorblat", "Zorblat Team"]], 5, 5, "Zorblat"),  # plenty of both
    _row(1, "Pellow", 5, 1, "Pellow"),  # one negative: the rest are positives
    _row(2, ["Quenby"], 1, 6, "Quenby"),  # one positive: the rest are negatives
    _row(3, [["Marr"], ["Quillon Marr", "Q. Marr"]], 4, 4, "Quillon Marr"),  # part 2 implies part 1
    _row(4, ["Ann Vell", "Bo Trask"], 4, 4, "Ann Vell and Bo Trask"),  # two independent parts: skipped
    _row(5, ["Kestrel Bay"], 4, 5, "Kestrel Bay", leak="KÉSTREL BAY!"),  # a negative names the answer
    _row(6, ["Orrin"], 5, 0, "Orrin"),  # no negatives at all
]


@pytest.fixture
def en_json(tmp_path: Path) -> Path:
    path = tmp_path / "en.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def _split(row: dict, docs: list[str]) -> tuple[int, int]:
    return sum(d in row["positive"] for d in docs), sum(d in row["negative"] for d in docs)


def test_sample_takes_the_first_positives_and_negatives():
    row = ROWS[0]
    docs = rgb.sample(row, 0.4)
    assert _split(row, docs) == (3, 2)
    assert sorted(docs) == sorted(row["positive"][:3] + row["negative"][:2])
    docs = rgb.sample(row, 0.8)
    assert _split(row, docs) == (1, 4)
    assert sorted(docs) == sorted(row["positive"][:1] + row["negative"][:4])
    assert sorted(rgb.sample(row, 1.0)) == sorted(row["negative"][:5])


def test_sample_falls_back_when_rgb_has_too_few():
    assert _split(ROWS[1], rgb.sample(ROWS[1], 0.4)) == (4, 1)  # too few negatives: more positives
    assert _split(ROWS[1], rgb.sample(ROWS[1], 0.8)) == (4, 1)
    assert _split(ROWS[2], rgb.sample(ROWS[2], 0.4)) == (1, 4)  # too few positives: more negatives
    assert _split(ROWS[6], rgb.sample(ROWS[6], 0.4)) == (5, 0)
    assert rgb.sample(ROWS[1], 1.0) == ROWS[1]["negative"]  # noise 1.0 has no fall-back
    assert rgb.sample(ROWS[6], 1.0) == []


def test_rgb_order_is_deterministic_and_the_same_for_every_question():
    """RGB reseeds with 2333 before each shuffle: at noise 0.4 the positives land in slots 0, 3 and 4 for
    every question, at 0.8 the positive is always last. The global random state is left alone."""
    random.seed(7)
    expected = random.random()
    random.seed(7)
    slots = set()
    for row in (ROWS[0], ROWS[3], ROWS[5]):
        docs = rgb.sample(row, 0.4)
        assert docs == rgb.sample(row, 0.4)
        slots.add(tuple(i for i, d in enumerate(docs) if d in row["positive"]))
        assert rgb.sample(row, 0.8)[-1] in row["positive"]
    assert slots == {(0, 3, 4)}
    assert random.random() == expected


def test_question_order_shuffles_the_same_passages_per_question():
    orders = set()
    for row in (ROWS[0], ROWS[3], ROWS[5]):
        docs, qdocs = rgb.sample(row, 0.4), rgb.sample(row, 0.4, order="question")
        assert sorted(qdocs) == sorted(docs)
        assert qdocs == rgb.sample(row, 0.4, order="question")
        orders.add(tuple(i for i, d in enumerate(qdocs) if d in row["positive"]))
    assert len(orders) > 1  # the positives' slots vary from question to question
    with pytest.raises(ValueError, match="order"):
        rgb.sample(ROWS[0], 0.4, order="random")


def test_flatten_answer():
    assert rgb.flatten_answer("Pellow") == ["Pellow"]
    assert rgb.flatten_answer(["Quenby"]) == ["Quenby"]
    assert rgb.flatten_answer([["Zorblat", "zorblat", " ", "Zorblat Team"]]) == ["Zorblat", "Zorblat Team"]
    assert rgb.flatten_answer([["Marr"], ["Quillon Marr", "Q. Marr"]]) == ["Quillon Marr", "Q. Marr"]
    assert rgb.flatten_answer(["Ann Vell", "Bo Trask"]) is None
    assert rgb.flatten_answer([[" "]]) is None


def test_leaks_is_lenient_about_case_accents_and_punctuation():
    assert rgb.leaks("Some say KÉSTREL BAY!", ["Kestrel Bay"])
    assert not rgb.leaks("The harbour council met.", ["Kestrel Bay"])


def test_build_writes_every_file(tmp_path: Path, en_json: Path):
    rows = rgb.load_rows(en_json)
    report = rgb.build(rows, tmp_path / "out")
    assert report.written == {
        "en5.jsonl": 6,
        "en5_qshuf.jsonl": 6,
        "en5_noise08.jsonl": 6,
        "en5_noise08_qshuf.jsonl": 6,
        "en_none.jsonl": 4,
        "en_none_qshuf.jsonl": 4,
    }
    assert (report.skipped_multipart, report.skipped_leaking, report.skipped_no_negatives) == (1, 1, 1)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(report.written)  # no .part left

    def read(name: str) -> list[dict]:
        text = (tmp_path / "out" / name).read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines()]

    en5 = read("en5.jsonl")
    assert [r["rgb_id"] for r in en5] == [0, 1, 2, 3, 5, 6]
    assert en5[0] == {
        "question": ROWS[0]["query"],
        "answers": ["Zorblat", "Zorblat Team"],
        "contexts": rgb.sample(ROWS[0], 0.4),
        "rgb_id": 0,
    }
    none = read("en_none.jsonl")
    assert [r["rgb_id"] for r in none] == [0, 1, 2, 3]
    assert all(r["answerable"] is False and r["answers"] == [rgb.RGB_ABSTAIN] for r in none)
    for stem in ("en5", "en5_noise08", "en_none"):
        plain, shuffled = read(f"{stem}.jsonl"), read(f"{stem}_qshuf.jsonl")
        assert [r["rgb_id"] for r in plain] == [r["rgb_id"] for r in shuffled]
        assert all(Counter(a["contexts"]) == Counter(b["contexts"]) for a, b in zip(plain, shuffled))
        assert any(a["contexts"] != b["contexts"] for a, b in zip(plain, shuffled))
        examples, problems = load_examples(tmp_path / "out" / f"{stem}.jsonl")  # what `turborag eval` reads
        assert problems == [] and len(examples) == len(plain)


def test_cli_builds_and_reports_each_file(tmp_path: Path, en_json: Path):
    result = runner.invoke(cli, ["--rgb-json", str(en_json), "--out", str(tmp_path / "rgb")])
    assert result.exit_code == 0, result.output
    assert "wrote 6 questions to" in result.output and "en5_noise08_qshuf.jsonl" in result.output
    assert "wrote 4 questions to" in result.output and "en_none.jsonl" in result.output


def test_cli_missing_file_is_one_line(tmp_path: Path):
    result = runner.invoke(cli, ["--rgb-json", str(tmp_path / "nope.json"), "--out", str(tmp_path / "rgb")])
    assert result.exit_code == 2
    assert "error: no file" in result.output and "chen700564/RGB" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", "line 2: not valid JSON"),
        (json.dumps({"id": 9, "query": "q?", "answer": "a", "positive": []}), "line 2: missing negative"),
        (json.dumps({**ROWS[0], "positive": "one passage"}), "line 2: 'positive' must be a list"),
    ],
)
def test_cli_names_the_malformed_line(tmp_path: Path, bad: str, message: str):
    path = tmp_path / "en.json"
    path.write_text(json.dumps(ROWS[0]) + "\n" + bad + "\n", encoding="utf-8")
    result = runner.invoke(cli, ["--rgb-json", str(path), "--out", str(tmp_path / "rgb")])
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "rgb").exists()


# ---------------------------------------------------------------- optional external data

SHARED_RGB = Path("/work/shared/benchmarks/rgb")  # the workplace's reference build; absent elsewhere


@pytest.mark.parametrize("stem", ["en5", "en5_noise08", "en_none"])
def test_reference_qshuf_files_are_our_shuffle_of_the_same_passages(stem: str):
    """Reads OPTIONAL EXTERNAL DATA (skipped when absent): the reference RGB files built outside this repo.

    Each _qshuf line holds the same passages as the plain line. Undoing RGB's fixed permutation on the
    plain line gives the passages before the shuffle; our per-question shuffle of them must give the
    _qshuf line, so files built here line up with the reference ones."""
    plain_path, qshuf_path = SHARED_RGB / f"{stem}.jsonl", SHARED_RGB / f"{stem}_qshuf.jsonl"
    if not (plain_path.is_file() and qshuf_path.is_file()):
        pytest.skip(f"optional external data: no {plain_path} / {qshuf_path}")
    plain = [json.loads(line) for line in plain_path.read_text(encoding="utf-8").splitlines()]
    shuffled = [json.loads(line) for line in qshuf_path.read_text(encoding="utf-8").splitlines()]
    assert len(plain) == len(shuffled) > 0
    for a, b in zip(plain, shuffled):
        assert a["rgb_id"] == b["rgb_id"] and a["question"] == b["question"]
        assert Counter(a["contexts"]) == Counter(b["contexts"])
        n = len(a["contexts"])
        slots = list(range(n))
        random.Random(rgb.RGB_SEED).shuffle(slots)  # slot i of the file holds passage slots[i]
        before = [None] * n
        for i, s in enumerate(slots):
            before[s] = a["contexts"][i]
        row = {"id": a["rgb_id"], "positive": [], "negative": before}
        assert rgb.sample(row, 1.0, passage_num=n) == a["contexts"]
        assert rgb.sample(row, 1.0, passage_num=n, order="question") == b["contexts"]
