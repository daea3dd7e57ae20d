import hashlib
import json
from collections import Counter

import pytest

from turborag.eval.metrics import contains_answer
from turborag_research import synth
from turborag_research.synth import DOMAINS, generate, write_jsonl


@pytest.fixture(scope="module")
def records():
    return generate(300, 6, seed=7)


def test_deterministic_for_a_seed():
    assert generate(20, 5, seed=3) == generate(20, 5, seed=3)


def _digest(records: list[dict]) -> str:
    """sha256 of the records as `write_jsonl` writes them."""
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return hashlib.sha256(lines.encode()).hexdigest()


def test_output_for_a_seed_is_pinned():
    """The digests were taken before template families existed: the default output (and the variants')
    must not change, since `turborag data synth` sets and the fine-tune's earlier mixes replay seeds."""
    default = generate(40, 5, seed=7)
    assert _digest(default) == "145e6a0a483da1a56635035b1de7f3e1ba72bc74d5015cf88f11fcafdf364e3d"
    variants = generate(20, 6, seed=3, hard=True, unanswerable=0.25, sentence_answers=True)
    assert _digest(variants) == "6c71358066bb5121858529caefd8ad1a93724cd98db284e3cb8299531c0a756b"


def test_different_seeds_differ():
    assert generate(20, 5, seed=1) != generate(20, 5, seed=2)


def test_shapes(records):
    assert len(records) == 300
    for record in records:
        assert set(record) == {"question", "answers", "contexts", "domain", "answer_index"}
        assert len(record["contexts"]) == 6
        assert record["question"].endswith("?")
        assert record["answers"] and all(isinstance(a, str) and a for a in record["answers"])
        assert 1 <= len(record["answers"][0].split()) <= 3
        assert record["domain"] in DOMAINS
        assert 0 <= record["answer_index"] < 6


def test_single_context_is_the_gold_passage():
    for record in generate(10, 1, seed=0):
        assert record["answer_index"] == 0
        assert contains_answer(record["contexts"][0], record["answers"])


def test_gold_passage_contains_answer(records):
    for record in records:
        gold = record["contexts"][record["answer_index"]]
        assert any(answer in gold for answer in record["answers"])


def test_no_distractor_contains_gold_answer(records):
    for record in records:
        for i, passage in enumerate(record["contexts"]):
            if i == record["answer_index"]:
                continue
            assert not any(answer.lower() in passage.lower() for answer in record["answers"])
            assert not contains_answer(passage, record["answers"])


def test_passages_are_distinct_and_chunk_sized(records):
    for record in records:
        assert len(set(record["contexts"])) == len(record["contexts"])
        for passage in record["contexts"]:
            assert 40 <= len(passage.split()) <= 90


def test_distractors_mostly_share_the_gold_attribute():
    # With K = 4 there are two same-template distractors, so at least 3 passages state the same kind of fact.
    markers = {
        "Who is the mayor": "mayor",
        "Which river": "River",
        "What is the population": "people",
        "What is the best-known landmark": "landmark",
    }
    for record in generate(50, 4, seed=5, domains=["city"]):
        marker = next(m for prefix, m in markers.items() if record["question"].startswith(prefix))
        assert sum(marker in passage for passage in record["contexts"]) >= 3


def test_answer_position_uniform_by_default(records):
    counts = Counter(record["answer_index"] for record in records)
    assert set(counts) == set(range(6))
    assert min(counts.values()) > 20


@pytest.mark.parametrize("position", [0, 2, 4])
def test_answer_position_honoured(position):
    for record in generate(30, 5, seed=1, answer_position=position):
        assert record["answer_index"] == position
        assert any(answer in record["contexts"][position] for answer in record["answers"])


def test_domain_restriction():
    chosen = ["music", "film"]
    records = generate(60, 4, seed=2, domains=chosen)
    assert {record["domain"] for record in records} == set(chosen)


def test_all_domains_are_used_by_default(records):
    assert {record["domain"] for record in records} == set(DOMAINS)


def test_domains_have_several_templates():
    assert len(DOMAINS) >= 8
    for domain in synth._DOMAIN_LIST:
        assert len(domain.templates) >= 3, domain.name
        assert len({t.question for t in domain.templates}) == len(domain.templates)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 0, "contexts": 3},
        {"n": 5, "contexts": 0},
        {"n": 5, "contexts": 3, "domains": ["company", "wizardry"]},
        {"n": 5, "contexts": 3, "domains": []},
        {"n": 5, "contexts": 3, "answer_position": 3},
        {"n": 5, "contexts": 3, "answer_position": -1},
    ],
)
def test_bad_arguments_raise(kwargs):
    with pytest.raises(ValueError):
        generate(**kwargs)


def test_write_jsonl(tmp_path):
    records = generate(5, 3, seed=4)
    path = tmp_path / "sub" / "synth.jsonl"
    write_jsonl(records, path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == records
