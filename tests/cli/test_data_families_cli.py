"""`turborag data synth|mix --families`: template families on the command line
(turborag_research/families.py)."""

import json

from typer.testing import CliRunner

from turborag.cli import app
from turborag_research import families as fam

runner = CliRunner()


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_mix_draws_seen_families_unless_told_legacy(tmp_path):
    seen, legacy = tmp_path / "seen.jsonl", tmp_path / "legacy.jsonl"
    r = runner.invoke(app, ["data", "mix", "--n", "30", "--seed", "2", "--out", str(seen)])
    assert r.exit_code == 0, r.output
    args = ["data", "mix", "--n", "30", "--seed", "2", "--out", str(legacy), "--families", "legacy"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    new, old = _rows(seen), _rows(legacy)
    synth = [row for row in new if row["source"].startswith("synth:")]
    assert synth and all(row["layout"] in fam.SEEN.layouts and not fam.held_out_parts(row) for row in synth)
    assert not any("layout" in row for row in old)
    # only the synthetic questions depend on the families
    assert [a for a in new if a["source"].startswith("stdlib:")] == [
        b for b in old if b["source"].startswith("stdlib:")
    ]


def test_mix_rejects_unknown_families_in_one_line(tmp_path):
    r = runner.invoke(app, ["data", "mix", "--out", str(tmp_path / "m.jsonl"), "--families", "unseen"])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [
        "error: --families must be one of legacy, all, seen, got 'unseen'"
    ]


def test_synth_takes_families(tmp_path):
    out = tmp_path / "s.jsonl"
    r = runner.invoke(app, ["data", "synth", "--n", "7", "--out", str(out), "--families", "unseen"])
    assert r.exit_code == 0, r.output
    assert all(fam.held_out_parts(row) for row in _rows(out))
    r = runner.invoke(app, ["data", "synth", "--n", "3", "--out", str(out)])
    assert r.exit_code == 0 and not any("layout" in row for row in _rows(out))  # legacy by default
    r = runner.invoke(app, ["data", "synth", "--n", "2", "--out", str(out), "--families", "nope"])
    assert r.exit_code == 2
    expected = "error: --families must be one of legacy, all, seen, unseen, got 'nope'"
    assert r.stderr.strip().splitlines() == [expected]
