"""`turborag calibrate` (eval/calibrate.py): full and every training-free candidate on the user's questions,
the best recorded next to the model, and `--mode auto` answering in it with its settings."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from helpers import CORPUS, QUESTIONS, cli_json
from typer.testing import CliRunner

from turborag.cli import app
from turborag.core.engine import Engine
from turborag.core.model import CALIBRATION_FILE, ModelError, load_model
from turborag.core.options import EngineOptions
from turborag.eval.calibrate import CANDIDATES, Candidate, calibrate
from turborag.eval.evaluate import load_examples
from turborag.store.kv_store import KVStore

runner = CliRunner()


def _qa_file(path, rgb: bool = False):
    """Our own made-up questions, three passages each (the answering one and two others)."""
    names = list(CORPUS)
    with path.open("w") as f:
        for i, (question, name) in enumerate(QUESTIONS[:3]):
            others = [CORPUS[n] for n in names if n != name][i : i + 2]
            record = {"question": question, "answers": ["x"], "contexts": [CORPUS[name], *others]}
            if rgb:
                record["rgb_id"] = i
            f.write(json.dumps(record) + "\n")
    return path


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    """A private copy of the tiny model folder: calibration writes into it."""
    return shutil.copytree(tiny_model_dir, tmp_path / "model")


def test_calibrate_records_the_best_candidate_and_auto_uses_it(env, model_copy, tmp_path):
    data = _qa_file(tmp_path / "qa.jsonl")
    args = ["--model", str(model_copy), "--dtype", "float32", "--limit", "2", "--max-new-tokens", "4"]
    args.append("--json")
    r = runner.invoke(app, ["calibrate", str(data), *args])
    record = cli_json(r)
    assert [c["label"] for c in record["candidates"]] == [c.label for c in CANDIDATES]
    best = max(c["accuracy"] for c in record["candidates"])
    assert record["accuracy"] == best
    first_best = next(c for c in record["candidates"] if c["accuracy"] == best)
    assert record["label"] == first_best["label"]  # a tie goes to the cheaper candidate
    assert record["n"] == 2 and record["data"]["sha256"]
    written = json.loads((model_copy / CALIBRATION_FILE).read_text())
    assert written["mode"] == record["mode"] and written["settings"] == record["settings"]

    lm = load_model(str(model_copy), dtype="float32")
    engine = Engine(lm, KVStore(tmp_path / "s", cache_format="float32"))
    assert engine.resolve_mode("auto") == record["mode"]
    for name, value in record["settings"].items():
        assert getattr(engine, name) == value
    assert "turborag calibrate" in engine.auto_notice()


def test_auto_uses_the_recorded_settings_and_says_when_below_full(gemma_lm, tmp_path):
    gemma_lm.calibration = {
        "mode": "turbo-ape",
        "settings": {"ape_temperature": 0.7, "ape_scale": 0.8},
        "accuracy": 0.40,
        "full_accuracy": 0.50,
        "n": 60,
    }
    engine = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"))
    assert engine.resolve_mode("auto") == "turbo-ape"
    assert (engine.training_free.ape_temperature, engine.training_free.ape_scale) == (0.7, 0.8)
    assert "10% below full" in engine.auto_notice()
    assert "plain turbo" not in engine.auto_notice() and "too few" not in engine.auto_notice()
    explicit = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(ape_temperature=1.0))
    assert explicit.training_free.ape_temperature == 1.0  # an explicit setting wins over the record


def test_rgb_is_refused(env, model_copy, tmp_path):
    data = _qa_file(tmp_path / "rgb.jsonl", rgb=True)
    r = runner.invoke(app, ["calibrate", str(data), "--model", str(model_copy)])
    assert r.exit_code == 2 and "RGB" in r.output
    assert not (model_copy / CALIBRATION_FILE).exists()


def test_dry_run_writes_nothing(env, model_copy, tmp_path):
    data = _qa_file(tmp_path / "qa.jsonl")
    r = runner.invoke(
        app,
        ["calibrate", str(data), "--model", str(model_copy), "--dtype", "float32", "--limit", "1"]
        + ["--max-new-tokens", "4", "--dry-run"],
    )
    assert r.exit_code == 0, r.output
    assert "chosen:" in r.output
    assert not (model_copy / CALIBRATION_FILE).exists()


def test_candidates_restore_the_engine_settings(gemma_lm, tmp_path):
    engine = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32"))
    data = _qa_file(tmp_path / "qa.jsonl")
    examples, _ = load_examples(data, 1)
    before = engine.training_free.ape_temperature
    calibrate(engine, examples, [Candidate("turbo-ape", {"ape_temperature": 0.5})], 4, progress=False)
    assert engine.training_free.ape_temperature == before
    with pytest.raises(ValueError, match="unknown setting"):
        calibrate(engine, examples, [Candidate("turbo", {"temperature": 2})], 4, progress=False)


def test_a_damaged_record_is_a_clear_error(model_copy):
    (model_copy / CALIBRATION_FILE).write_text("{not json")
    with pytest.raises(ModelError, match="turborag calibrate"):
        load_model(str(model_copy), dtype="float32")


def test_auto_says_when_the_pick_is_slow_or_the_calibration_thin(gemma_lm, tmp_path):
    """The bar for a training-free pick: within 3 points of full and at most 1.5x plain turbo's TTFT, judged
    on questions full answers enough of. SmolLM2's first calibration (30 questions, full right on 4) picked a
    mode 23 points above full at 1.55x turbo's TTFT, and `auto` said nothing."""
    gemma_lm.calibration = {
        "mode": "turbo-ape-epic",
        "settings": {},
        "accuracy": 11 / 30,
        "full_accuracy": 4 / 30,
        "n": 30,
        "ttft_s_p50": 0.150,
        "turbo_ttft_s_p50": 0.096,
    }
    notice = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32")).auto_notice()
    assert "below full" not in notice
    assert "1.6x plain turbo's" in notice
    assert "full answered only 4 of the 30 calibration questions" in notice
    gemma_lm.calibration.update(full_accuracy=12 / 30, accuracy=12 / 30, ttft_s_p50=0.12)
    notice = Engine(gemma_lm, KVStore(tmp_path, cache_format="float32")).auto_notice()
    assert notice == "tiny-gemma3: `auto` answers in turbo-ape-epic, as `turborag calibrate` chose"


def test_the_named_qwen_ships_its_calibration_and_a_users_own_comes_first(model_copy):
    """Qwen by name answers `auto` in the mode its shipped record chose, measured on our own questions
    (never an evaluation set); a calibration the user records next to the model replaces it."""
    from turborag.core.defaults import QWEN_MODEL
    from turborag.core.model import calibration

    (model_copy / CALIBRATION_FILE).unlink(missing_ok=True)
    shipped = calibration(model_copy, QWEN_MODEL)
    assert shipped["mode"] == "turbo" and shipped["model"] == QWEN_MODEL
    data = Path(__file__).parents[2] / shipped["data"]["path"]  # our training data, in the repository
    assert shipped["data"]["path"].startswith("turborag_research/data/") and shipped["n"] >= 30
    assert hashlib.sha256(data.read_bytes()).hexdigest() == shipped["data"]["sha256"]
    assert calibration(model_copy, "some/other/model") is None
    (model_copy / CALIBRATION_FILE).write_text(json.dumps({"mode": "turbo-blend", "settings": {}}))
    assert calibration(model_copy, QWEN_MODEL)["mode"] == "turbo-blend"


def test_the_threshold_declines_most_while_sparing_the_answerable():
    """The lowest threshold wins only while the answerable questions stay under the bound in every mode;
    a tie in declines goes to the higher (more conservative) threshold."""
    import math

    from turborag.eval.calibrate import choose_threshold

    lp = math.log
    answerable = {"turbo": [lp(0.01), lp(0.04), lp(0.2)], "full": [lp(0.01), lp(0.02), lp(0.06)]}
    unanswerable = {"turbo": [lp(0.6), lp(0.35), lp(0.12)], "full": [lp(0.5), lp(0.3), lp(0.1)]}
    chosen = choose_threshold(answerable, unanswerable, "turbo", 0.0, thresholds=(0.5, 0.3, 0.25, 0.1, 0.05))
    # 0.1 would decline all three, but forces the reply on turbo's 0.2 answerable question
    assert chosen["threshold"] == 0.3
    row = next(r for r in chosen["thresholds"] if r["threshold"] == 0.3)
    assert row["abstain"] == {"turbo": 2 / 3, "full": 2 / 3} and row["false_abstain"]["turbo"] == 0
    # allowing one answerable question in three: 0.1 passes in turbo, and full's 0.06 stays under it
    assert choose_threshold(answerable, unanswerable, "turbo", 1 / 3)["threshold"] in (0.1, 0.07, 0.05)
    none = choose_threshold({"turbo": [lp(0.9)]}, {"turbo": [lp(0.001)]}, "turbo")
    assert none["threshold"] is None  # nothing declined within the bound: no threshold at all


def test_calibrate_chooses_a_threshold_the_model_then_answers_with(env, model_copy, tmp_path):
    from turborag.core.prompt import ABSTAIN

    data = _qa_file(tmp_path / "qa.jsonl")
    twins = tmp_path / "twins.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    unanswerable = [
        {**r, "answers": [ABSTAIN], "answerable": False, "contexts": r["contexts"][1:]} for r in rows
    ]
    twins.write_text("".join(json.dumps(r) + "\n" for r in unanswerable))
    args = ["--model", str(model_copy), "--dtype", "float32", "--limit", "2", "--max-new-tokens", "4"]
    r = runner.invoke(app, ["calibrate", str(data), *args, "--unanswerable", str(twins), "--json"])
    record = cli_json(r)
    chosen = record["abstain"]
    assert chosen["n_answerable"] == 2 and chosen["n_unanswerable"] == 2 and chosen["data"]["sha256"]
    assert set(chosen["thresholds"][0]["abstain"]) == {record["mode"], "full"}
    assert record["abstain_threshold"] == chosen["threshold"]
    # whatever a random model's probabilities are, the chosen one obeys the bound of 0 false declines
    for row in chosen["thresholds"]:
        if row["threshold"] == chosen["threshold"]:
            assert max(row["false_abstain"].values()) == 0
    written = json.loads((model_copy / CALIBRATION_FILE).read_text())
    written["abstain_threshold"] = 0.25  # what a calibration records, the model answers with
    (model_copy / CALIBRATION_FILE).write_text(json.dumps(written))
    assert load_model(str(model_copy), dtype="float32").abstain_threshold == 0.25


def test_unanswerable_records_must_say_so(env, model_copy, tmp_path):
    data = _qa_file(tmp_path / "qa.jsonl")
    r = runner.invoke(app, ["calibrate", str(data), "--model", str(model_copy), "--unanswerable", str(data)])
    assert r.exit_code == 2 and "answerable: false" in r.output
    r = runner.invoke(
        app, ["calibrate", str(data), "--model", str(model_copy), "--unanswerable", "nope.jsonl"]
    )
    assert r.exit_code == 2 and "no such file" in r.output
