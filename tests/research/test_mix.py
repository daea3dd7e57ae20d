"""The fine-tune's training mix (shares, passage counts, no held-out data) and the hard and unanswerable
synthetic variants it is built from."""

import hashlib
import json
import re
from collections import Counter

import pytest
from typer.testing import CliRunner

from turborag.cli import app
from turborag.eval.metrics import ABSTAIN, contains_answer, normalize_answer
from turborag_research import families as fam
from turborag_research import synth
from turborag_research.mix import (
    HELD_OUT_DOMAINS,
    TRAIN_DOMAINS,
    build_eval_sets,
    build_mix,
)
from turborag_research.realtext import EVAL_MODULES, TRAIN_MODULES
from turborag_research.synth import generate

runner = CliRunner()
N = 1000


@pytest.fixture(scope="module")
def mix():
    return build_mix(N, seed=0)


def _part(record: dict) -> tuple[str, bool]:
    return record["source"].split(":", 1)[0], record["answerable"]


def _package(record: dict) -> str:
    return record["source"].removeprefix("stdlib:").split(".")[0]


def test_deterministic_for_a_seed():
    assert build_mix(40, seed=3) == build_mix(40, seed=3)
    assert build_mix(40, seed=3) != build_mix(40, seed=4)


def test_shares(mix):
    assert len(mix) == N
    assert Counter(_part(r) for r in mix) == {
        ("synth", True): 425,
        ("stdlib", True): 425,
        ("synth", False): 75,
        ("stdlib", False): 75,
    }
    # shuffled, not in blocks
    assert len({_part(r) for r in mix[:50]}) >= 3


def test_passage_counts_weight_long_contexts(mix):
    counts = Counter(len(r["contexts"]) for r in mix)
    assert min(counts) == 1 and max(counts) == 32
    long_share = sum(n for k, n in counts.items() if k >= 8) / N
    assert 0.55 <= long_share <= 0.65  # 60% in 8..32, 40% in 1..7
    assert len(counts) >= 30  # every count is drawn
    for part in {_part(r) for r in mix}:
        ks = [len(r["contexts"]) for r in mix if _part(r) == part]
        assert sum(k >= 8 for k in ks) / len(ks) > 0.4


def test_records_share_one_shape_and_targets(mix):
    """Real text answers in sentences; synthetic facts with the value (default) or the fact sentence."""
    for r in mix:
        assert {"question", "answers", "contexts", "answer_index", "answerable", "source", "kind"} <= set(r)
        if r["answerable"]:
            gold = r["contexts"][r["answer_index"]]
            assert all(span in gold for span in r["answers"][1:] or r["answers"])
            if r["source"].startswith("stdlib:"):
                assert len(r["answers"][0].split()) >= 4, r["answers"]
            else:
                assert r["answers"][0] in gold
        else:
            assert r["answers"] == [ABSTAIN] and r["answer_index"] is None
    synth_targets = [r["answers"][0] for r in mix if r["answerable"] and r["source"].startswith("synth:")]
    assert sum(len(t.split()) <= 3 for t in synth_targets) / len(synth_targets) > 0.9
    sentences = build_mix(60, seed=1, synth_answers="sentence")
    targets = [r["answers"][0] for r in sentences if r["answerable"] and r["source"].startswith("synth:")]
    assert targets and all(len(t.split()) >= 4 for t in targets)


def test_shares_and_answers_are_checked():
    assert sum(not r["answerable"] for r in build_mix(40, seed=0, unanswerable=0.5)) == 20
    assert all(r["answerable"] for r in build_mix(40, seed=0, unanswerable=0.0))
    with pytest.raises(ValueError, match="share"):
        build_mix(10, unanswerable=1.5)
    with pytest.raises(ValueError, match="synth_answers"):
        build_mix(10, synth_answers="word")


def test_paired_unanswerable_records_are_twins_of_answerable_ones():
    """A twin is an answerable record of the same mix minus its answering passage, target the abstention;
    the unanswerable share is unchanged, and paired=0 is the mix of before."""
    plain = build_mix(120, seed=5, unanswerable=0.3)
    assert build_mix(120, seed=5, unanswerable=0.3, paired=0.0) == plain
    paired = build_mix(120, seed=5, unanswerable=0.3, paired=1.0, doc_style=0.5)
    assert sum(not r["answerable"] for r in paired) == 36
    answerable = {r["question"]: r for r in paired if r["answerable"]}
    twins = [r for r in paired if r.get("twin")]
    assert len(twins) >= 30  # every slot found an answerable record of its source to twin
    assert {_part(r) for r in twins} == {("synth", False), ("stdlib", False)}
    for t in twins:
        source = answerable[t["question"]]  # the twin's question is asked answerably elsewhere in the mix
        gold = source["contexts"][source["answer_index"]]
        assert t["contexts"] == [c for c in source["contexts"] if c != gold]
        assert t["answers"] == [ABSTAIN] and t["answer_index"] is None
        assert t.get("style") == source.get("style")  # same layout: layout is no cue
        assert not any(contains_answer(c, source["answers"][1:] or source["answers"]) for c in t["contexts"])
    half = build_mix(120, seed=5, unanswerable=0.3, paired=0.5)
    assert sum(bool(r.get("twin")) for r in half) == 18
    with pytest.raises(ValueError, match="paired"):
        build_mix(10, paired=2.0)


def test_synth_unanswerable_share_moves_unanswerable_records_between_the_halves():
    """synth_unanswerable sets how many non-prose unanswerable records are synthetic; 0.5 is the mix of
    before, and the answerable records and the unanswerable total stay as they were."""
    plain = build_mix(120, seed=5, unanswerable=0.3)
    assert build_mix(120, seed=5, unanswerable=0.3, synth_unanswerable=0.5) == plain
    for share, expected in ((1.0, 36), (0.8, 28), (0.0, 0)):
        records = build_mix(120, seed=5, unanswerable=0.3, synth_unanswerable=share)
        parts = Counter(_part(r) for r in records)
        assert parts[("synth", False)] == expected
        assert parts[("stdlib", False)] == 36 - expected
        assert parts[("synth", True)] == Counter(_part(r) for r in plain)[("synth", True)]
    with pytest.raises(ValueError, match="synth_unanswerable"):
        build_mix(10, synth_unanswerable=-0.1)


def test_no_held_out_data_in_training(mix):
    train_packages = {m.split(".")[0] for m in TRAIN_MODULES}
    for r in mix:
        if r["source"].startswith("synth:"):
            assert r["domain"] in TRAIN_DOMAINS
            assert not any("Film students" in passage for passage in r["contexts"])
        else:
            assert _package(r) in train_packages


def test_eval_sets():
    sets = build_eval_sets(n=40, contexts=5, seed=1)
    assert set(sets) == {
        "realtext",
        "unanswerable",
        "realtext-doc",
        "unanswerable-doc",
        "prose-doc",
        "prose-unanswerable-doc",
        "synth-seen",  # added with the template families
        "synth-unseen",
        "synth-topical",  # added with the topical twins (topical.py)
        "prose-topical-doc",
    }
    eval_packages = {m.split(".")[0] for m in EVAL_MODULES}
    realtext = sets["realtext"]
    assert len(realtext) == 40 and all(r["answerable"] and len(r["contexts"]) == 5 for r in realtext)
    assert all(_package(r) in eval_packages for r in realtext)
    unanswerable = sets["unanswerable"]
    assert len(unanswerable) == 40 and all(not r["answerable"] for r in unanswerable)
    assert all(len(r["contexts"]) == 5 and r["answers"] == [ABSTAIN] for r in unanswerable)
    parts = Counter(r["source"].split(":")[0] for r in unanswerable)
    assert parts == {"synth": 20, "stdlib": 20}
    for r in unanswerable:
        if r["source"].startswith("synth:"):
            assert r["domain"] in HELD_OUT_DOMAINS
        else:
            assert _package(r) in eval_packages
    assert build_eval_sets(n=10, seed=2) == build_eval_sets(n=10, seed=2)


def test_default_eval_sets_have_150_questions_of_5_passages():
    """All but the prose twins, which are the prose questions without their answering passage, and the
    topical prose twins, which leave out the questions whose passage cannot be stripped of its answer."""
    sets = build_eval_sets()
    for name, rows in sets.items():
        passages = 4 if name == "prose-unanswerable-doc" else 5
        assert all(len(r["contexts"]) == passages for r in rows), name
        if name == "prose-topical-doc":
            assert 130 <= len(rows) < 150
        else:
            assert len(rows) == 150, name


def _digest(records: list[dict]) -> str:
    """sha256 of the records as `write_jsonl` writes them."""
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return hashlib.sha256(lines.encode()).hexdigest()


def _synthetic(records: list[dict]) -> list[dict]:
    return [r for r in records if r["source"].startswith("synth:")]


def test_default_mix_draws_only_seen_families(mix):
    """By default the synthetic records come from seen template families only, every seen wording and
    layout drawn; the real-text records are those of a legacy mix."""
    rows = _synthetic(mix)
    assert all(set(fam.AXES) <= set(r) and not fam.held_out_parts(r) for r in rows)
    for axis, seen in (("wording", fam.SEEN.wordings), ("layout", fam.SEEN.layouts)):
        counts = Counter(r[axis] for r in rows)
        assert set(counts) == set(seen) and min(counts.values()) > len(rows) / len(seen) / 2, axis
    assert {r["answer_type"] for r in rows} == set(fam.SEEN.answer_types)
    assert not any(r["answer_type"] in fam.HELD_OUT_ANSWER_TYPES for r in rows)
    assert {r["layout"] for r in rows if not r["answerable"]} == set(fam.SEEN.layouts)
    legacy = build_mix(200, seed=0, families="legacy")
    for new, old in zip(build_mix(200, seed=0), legacy):
        assert new == old or (new["source"].startswith("synth:") and new["source"] == old["source"])


def test_legacy_families_reproduce_the_earlier_mixes():
    """The digest was taken before template families existed; only the synthetic records are pinned, as
    the real text comes from the standard library's docstrings, which vary with the Python version."""
    rows = build_mix(80, seed=1, unanswerable=0.3, paired=1.0, prose=0.2, families="legacy")
    assert _digest(_synthetic(rows)) == "5d511ff425cbacf7676c6201ee7d9c0e13fb77816d0146caeeaf0690f1c1732a"
    assert not any(set(fam.AXES) & set(r) for r in rows)
    everything = _synthetic(build_mix(200, seed=1, families="all"))
    assert {r["layout"] for r in everything} == set(fam.LAYOUTS)
    for bad in ("unseen", "held"):
        with pytest.raises(ValueError, match="families must be one of legacy, all, seen"):
            build_mix(10, families=bad)


def test_eval_sets_for_seen_and_unseen_families():
    sets = build_eval_sets(n=70, contexts=5, seed=1)
    seen, unseen = sets["synth-seen"], sets["synth-unseen"]
    for rows in (seen, unseen):
        assert len(rows) == 70 and all(r["answerable"] and len(r["contexts"]) == 5 for r in rows)
        assert all(r["source"] == f"synth:{r['domain']}" for r in rows)
        assert all(contains_answer(r["contexts"][r["answer_index"]], r["answers"]) for r in rows)
        assert len({r["entity"] for r in rows}) == 70  # made-up entities, none asked twice
    assert all(r["domain"] in TRAIN_DOMAINS and not fam.held_out_parts(r) for r in seen)
    parts = Counter(fam.held_out_parts(r) for r in unseen)
    assert len(parts) == 7 and set(parts.values()) == {10}  # every combination of the three axes, evenly
    domains = {r["domain"] for r in unseen}
    assert set(HELD_OUT_DOMAINS) <= domains and domains & set(TRAIN_DOMAINS)
    # every axis is held out somewhere, and each in its own way
    assert {r["wording"] for r in unseen} >= set(fam.HELD_OUT_WORDINGS)
    assert {r["layout"] for r in unseen} >= set(fam.HELD_OUT_LAYOUTS)
    assert {r["answer_type"] for r in unseen} >= set(fam.HELD_OUT_ANSWER_TYPES)
    training = {r["question"] for r in build_mix(300, seed=1)}
    assert not training & {r["question"] for r in seen + unseen}
    again = build_eval_sets(n=70, contexts=5, seed=1)
    assert again["synth-seen"] == seen and again["synth-unseen"] == unseen
    assert build_eval_sets(n=70, contexts=5, seed=2)["synth-unseen"] != unseen


def test_eval_sets_of_before_are_unchanged():
    """The new sets have generators of their own: the synthetic half of the unanswerable set is the one of
    before (digest taken before template families existed; the real text varies with Python's version)."""
    sets = build_eval_sets(n=20, seed=3)
    rows = _synthetic(sets["unanswerable"])
    assert _digest(rows) == "b889cea8cf61634014f565dcecd944e99ef843e2d486ce3488c050a2ae128b59"


def _one_letter_apart(a: str, b: str) -> bool:
    return len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1


def test_hard_synth_has_near_namesakes_that_differ_after_normalisation():
    records = generate(120, 8, seed=4, domains=TRAIN_DOMAINS, hard=True, sentence_answers=True)
    for r in records:
        entity = r["entity"]
        gold = r["contexts"][r["answer_index"]]
        assert entity in gold and r["answers"][0] in gold  # the fact sentence, copied from the passage
        assert r["answers"][1:] and all(a in gold for a in r["answers"][1:])
        namesakes = 0
        for i, passage in enumerate(r["contexts"]):
            if i == r["answer_index"]:
                continue
            assert not contains_answer(passage, r["answers"])
            assert not contains_answer(passage, [entity])
            words = set(re.findall(r"[A-Za-z]+", passage))
            namesakes += any(_one_letter_apart(w, e) for w in words for e in entity.split() if len(e) > 3)
        assert namesakes >= 1, r


def test_lookalike_names_keep_the_real_words():
    import random

    rng = random.Random(0)
    domain = next(d for d in synth._DOMAIN_LIST if d.name == "history")
    for _ in range(50):
        name = synth._lookalike_name(rng, "Treaty of Quorvik", domain.fixed_words)
        assert name.startswith("Treaty of ") and _one_letter_apart(name, "Treaty of Quorvik")
        assert normalize_answer(name) != normalize_answer("Treaty of Quorvik")


def test_unanswerable_synth_keeps_look_alikes_without_the_entity():
    records = generate(60, 5, seed=8, domains=TRAIN_DOMAINS, hard=True, unanswerable=1.0)
    for r in records:
        assert r["answers"] == [ABSTAIN] and r["answer_index"] is None and r["answerable"] is False
        assert len(r["contexts"]) == 5
        assert r["entity"] in r["question"]
        assert not any(contains_answer(passage, [r["entity"]]) for passage in r["contexts"])
        last = r["entity"].split()
        assert any(
            _one_letter_apart(w, e)
            for passage in r["contexts"]
            for w in re.findall(r"[A-Za-z]+", passage)
            for e in last
            if len(e) > 3
        )


def test_variants_off_keep_the_historical_shape():
    assert set(generate(3, 4, seed=1)[0]) == {"question", "answers", "contexts", "domain", "answer_index"}
    mixed = generate(20, 4, seed=1, unanswerable=0.25)
    assert sum(not r["answerable"] for r in mixed) == 5


def test_synth_rejects_a_bad_unanswerable_fraction():
    with pytest.raises(ValueError):
        generate(3, 4, unanswerable=-0.1)


def test_mix_command(env):
    out, held = env / "mix.jsonl", env / "held"
    r = runner.invoke(
        app, ["data", "mix", "--n", "20", "--seed", "1", "--out", str(out), "--eval-dir", str(held)]
    )
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 20 and sum(not row["answerable"] for row in rows) == 3  # 15%
    for name in (
        "realtext-eval.jsonl",
        "unanswerable-eval.jsonl",
        "synth-seen-eval.jsonl",
        "synth-unseen-eval.jsonl",
    ):
        assert len((held / name).read_text().splitlines()) == 150
    r = runner.invoke(
        app,
        [
            "data",
            "mix",
            "--n",
            "20",
            "--seed",
            "1",
            "--out",
            str(out),
            "--unanswerable",
            "0.5",
            "--paired",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(bool(row.get("twin")) for row in rows) >= 8
    small = env / "small"  # --eval-n sizes the held-out sets
    args = ["data", "mix", "--n", "2", "--out", str(out), "--eval-dir", str(small), "--eval-n", "7"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert len((small / "realtext-doc-eval.jsonl").read_text().splitlines()) == 7


def test_mix_command_rejects_bad_input_in_one_line(env):
    not_a_dir = env / "file"
    not_a_dir.write_text("x")
    r = runner.invoke(app, ["data", "mix", "--out", str(env / "m.jsonl"), "--eval-dir", str(not_a_dir)])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [f"error: --eval-dir {not_a_dir} is not a directory"]
    r = runner.invoke(app, ["data", "mix", "--out", str(env / "m.jsonl"), "--synth-answers", "word"])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == ["error: --synth-answers must be value or sentence, got 'word'"]
