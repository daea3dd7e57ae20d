"""Training recipes (turborag_research/recipe.py, `turborag finetune --recipe`): validation, data built once
and deterministically and checked against the recipe's data_sha256, a rerun that resumes, overrides
recorded, and no evaluation or demo text in the data.

Every run here trains the tiny random Gemma of conftest.py on a recipe scaled down to a few examples."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from importlib.resources import files
from pathlib import Path

import pytest
from typer.testing import CliRunner

import turborag.train.finetune as train
import turborag_research.recipe as recipe_mod
from turborag.cli import app
from turborag.core.defaults import BASE_MODEL
from turborag.core.model import name_check
from turborag_research.mix import build_mix
from turborag_research.recipe import (
    available,
    build_data,
    check_sources,
    load_recipe,
    parse_recipe,
    train_config,
)

SHIPPED = "gemma-3-270m-turbo"
runner = CliRunner()


def _raw(name: str = SHIPPED) -> dict:
    return json.loads(files("turborag_research").joinpath(f"recipes/{name}.json").read_text())


def _small(n: int = 2, model: str = BASE_MODEL, name: str = SHIPPED, **train_settings) -> dict:
    """A shipped recipe (the default adapter's unless `name` says) with every part cut to n examples (the
    test-only override) and a training of a few steps that the tiny model runs in seconds; the shipped
    data_sha256 is not its data's, so it goes. A recipe in stages gets that cut in every stage."""
    raw = _raw(name)
    raw["model"] = model
    for stage in raw.get("stages", [raw]):
        stage.pop("data_sha256", None)
        stage["data"] = [{**part, "n": n} for part in stage["data"]]
        stage["train"] = dict(
            steps=2, batch=1, lr=1e-3, warmup=1, rank=4, save_every=1, keep_every=0, seed=0, dtype="float32"
        )
        stage["train"]["max_passage_tokens"] = 16  # up to 32 passages an example: short ones keep a step fast
        stage["train"].update(train_settings)
    return raw


def test_shipped_recipe_loads_and_trains_from_the_base_model(tmp_path):
    r = load_recipe(SHIPPED)
    assert r.name == SHIPPED and r.model == BASE_MODEL
    assert r.examples >= r.train["steps"] * r.train["batch"] and len(r.parts) >= 2
    assert {p["seed"] for p in r.parts} == {p["seed"] for p in _raw()["data"]}
    assert any(p.get("paired") for p in r.parts) and any(p.get("prose") for p in r.parts)
    assert any(p.get("doc_style") for p in r.parts)
    assert all(set(p) <= set(inspect.signature(build_mix).parameters) for p in r.parts)
    assert r.train == dict(
        steps=200, batch=4, lr=2e-4, warmup=20, rank=16, save_every=10, keep_every=50, seed=0, dtype="auto"
    )
    cfg = train_config(r, tmp_path / "out")
    assert cfg.model == BASE_MODEL and cfg.init_adapter is None and cfg.lora and not cfg.causal
    assert cfg.data == str(tmp_path / "out" / "data.jsonl") and cfg.alpha == 32
    assert (cfg.recipe, cfg.recipe_hash) == (SHIPPED, r.hash)
    assert load_recipe(SHIPPED).hash == r.hash  # the hash is a function of the content
    assert train_config(r, tmp_path, {"steps": 5}).steps == 5


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(colour="red"), "unknown key 'colour'"),
        (lambda r: r["train"].update(momentum=0.9), "train: unknown key 'momentum'"),
        (lambda r: r["train"].update(max_passage_tokens=0), "max_passage_tokens must be an integer of at"),
        (lambda r: r["data"][1].update(colour="red"), "data part 2: build_mix takes no argument 'colour'"),
        (lambda r: r["data"][0].pop("seed"), "data part 1: needs its own 'seed'"),
        (lambda r: r["data"][0].update(n=0), "data part 1: n must be an integer of at least 1"),
        (lambda r: r["data"][0].update(n="many"), "n must be an integer"),
        (lambda r: r["data"][1].update(seed=r["data"][0]["seed"]), "share a seed"),
        (lambda r: r["train"].update(steps=0), "steps must be an integer of at least 1"),
        (lambda r: r["train"].update(steps=True), "steps must be an integer"),
        (lambda r: r["train"].update(lr=-1), "lr must be a positive number"),
        (lambda r: r["train"].update(dtype="fp8"), "dtype must be one of"),
        (lambda r: r["train"].pop("rank"), "missing key 'rank'"),
        (lambda r: r.pop("model"), "missing key 'model'"),
        (lambda r: r.update(data=[]), "data must be a non-empty list"),
        (lambda r: r.update(data_sha256="F2F9"), "data_sha256 must be 64 lower-case hex digits"),
        (lambda r: r.update(data_sha256=None), "data_sha256 must be 64 lower-case hex digits"),
        (lambda r: r.update(answering=True), "answering: must be an object of"),
        (lambda r: r.update(answering={"threshold": 0.3}), "answering: unknown key 'threshold'"),
        (lambda r: r.update(answering={"name_check": "yes"}), "name_check must be true or false"),
        (lambda r: r.update(answering={"abstain_threshold": 0}), "abstain_threshold must be a number in"),
        (lambda r: r.update(answering={"abstain_threshold": 1.5}), "abstain_threshold must be a number in"),
    ],
)
def test_invalid_recipes_are_refused_with_the_key_named(edit, message):
    raw = _raw()
    edit(raw)
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_recipe(raw, "test")


def test_recipe_files_and_names(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_small()))
    assert load_recipe(str(path)).source == str(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_recipe(str(path))
    with pytest.raises(ValueError, match=f"unknown recipe 'nope'.*{SHIPPED}"):
        load_recipe("nope")
    with pytest.raises(ValueError, match="no such recipe file"):
        load_recipe(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="cannot override 'init_adapter'"):
        train_config(load_recipe(SHIPPED), tmp_path, {"init_adapter": "x"})


def test_data_sha256_is_checked_but_not_part_of_the_recipes_hash():
    """The shipped recipe records its data's hash; recording one (or another) leaves the recipe's hash, so a
    run begun before it was recorded resumes and its adapter's recipe_hash stays valid."""
    shipped = load_recipe(SHIPPED)
    assert re.fullmatch(r"[0-9a-f]{64}", shipped.data_sha256)
    raw = _raw()
    del raw["data_sha256"]
    bare = parse_recipe(raw, "bare")
    assert bare.data_sha256 is None and bare.hash == shipped.hash
    assert parse_recipe({**raw, "data_sha256": "0" * 64}, "other").hash == shipped.hash


def test_answering_settings_are_not_part_of_the_recipes_hash():
    """The engine settings an adapter records (chosen after training, on held-out sets) can be added or
    changed without making another recipe, as data_sha256 can."""
    shipped = load_recipe(SHIPPED)
    assert shipped.answering == {"name_check": True}
    raw = _raw()
    del raw["answering"]
    bare = parse_recipe(raw, "bare")
    assert bare.answering is None and bare.hash == shipped.hash
    other = parse_recipe({**raw, "answering": {"abstain_threshold": 0.3}}, "other")
    assert other.answering == {"abstain_threshold": 0.3} and other.hash == shipped.hash


def test_a_recipe_whose_data_does_not_hash_to_its_data_sha256_fails_and_trains_on_nothing(tmp_path):
    raw = _small(n=2)
    right = _sha256_of(build_data(parse_recipe(raw, "probe"), tmp_path / "probe"))
    lines = []
    good = build_data(parse_recipe({**raw, "data_sha256": right}, "good"), tmp_path / "good", lines.append)
    assert _sha256_of(good) == right and lines[-1] == f"data: sha256 {right}, the one the recipe records"
    assert json.loads((tmp_path / "good" / "recipe.json").read_text())["data"]["sha256"] == right
    assert build_data(parse_recipe({**raw, "data_sha256": right}, "good"), tmp_path / "good") == good

    wrong = parse_recipe({**raw, "data_sha256": "0" * 64}, "wrong")
    out = tmp_path / "wrong"
    for _ in range(2):  # a rerun builds again and fails again: it never trains on the data
        with pytest.raises(
            ValueError, match=f"data built has sha256 {right}, the recipe records data_sha256 0{{64}}"
        ):
            build_data(wrong, out)
        assert not (out / "data.jsonl").exists() and not (out / "data.jsonl.part").exists()
        assert _sha256_of(out / "data.jsonl.mismatch") == right  # kept, to compare
        assert "data" not in json.loads((out / "recipe.json").read_text())
    # data found in the folder (built before the recipe recorded a hash) is checked too
    with pytest.raises(ValueError, match="does not reproduce"):
        build_data(parse_recipe({**raw, "data_sha256": "0" * 64}, "late"), tmp_path / "good")
    assert not good.exists() and (tmp_path / "good" / "data.jsonl.mismatch").exists()


def _sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _refuse_to_build(monkeypatch) -> None:
    """From now on building data fails the test (the stand-in keeps build_mix's signature for validation)."""

    @functools.wraps(build_mix)
    def refuse(*args, **kwargs):
        pytest.fail("data rebuilt")

    monkeypatch.setattr(recipe_mod, "build_mix", refuse)


def test_data_is_built_deterministically_once_and_never_mixed(tmp_path, monkeypatch):
    r = parse_recipe(_small(n=3), "small")
    a = build_data(r, tmp_path / "a")
    b = build_data(r, tmp_path / "b")
    assert a.read_bytes() == b.read_bytes() and len(a.read_text().splitlines()) == r.examples
    record = json.loads((tmp_path / "a" / "recipe.json").read_text())
    assert record["recipe"] == r.name and record["hash"] == r.hash and record["data"]["examples"] == 9
    # a second build finds the data: build_mix is not called, the file is not rewritten
    mtime = a.stat().st_mtime_ns
    _refuse_to_build(monkeypatch)
    lines = []
    assert build_data(r, tmp_path / "a", lines.append) == a and a.stat().st_mtime_ns == mtime
    assert lines == [f"data: {a} was built before, not rebuilt"]
    # another recipe in the same folder, an edited data file, a folder of a plain finetune: refused
    other = parse_recipe(_small(n=4), "other")
    with pytest.raises(ValueError, match="holds a run of recipe .* use another --out"):
        build_data(other, tmp_path / "a")
    a.write_text(a.read_text().replace("?", "!", 1))
    with pytest.raises(ValueError, match="was changed"):
        build_data(r, tmp_path / "a")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "latest").write_text("ckpt-5")
    with pytest.raises(ValueError, match="no recipe made"):
        build_data(r, tmp_path / "plain")


def test_a_part_that_build_mix_refuses_names_its_part(tmp_path):
    raw = _small()
    raw["data"][2]["prose"] = 1.5
    with pytest.raises(ValueError, match="data part 3: prose must be a share"):
        build_data(parse_recipe(raw, "bad"), tmp_path)
    assert not (tmp_path / "data.jsonl").exists() and not (tmp_path / "data.jsonl.part").exists()
    build_data(parse_recipe(_small(), "fixed"), tmp_path)  # nothing was built: the folder takes the fix


# Topics of pydoc_data that are the library reference's text (the pdb module and str methods are documented
# in their docstrings, which build_mix may use); every other topic is the language reference, the demo's.
LIBRARY_TOPICS = {
    "debugger", "string-methods", "typesmapping", "typesseq", "typesseq-mutable", "typesfunctions",
    "typesmethods", "typesmodules", "bltin-code-objects", "bltin-type-objects", "bltin-ellipsis-object",
    "bltin-null-object", "truth", "specialattrs", "formatstrings",
}  # fmt: skip


def _sentences(text: str) -> set[str]:
    """Whitespace-normalised sentences of 60 characters or more (long enough to be distinctive)."""
    text = re.sub(r"\s+", " ", text)
    return {s for s in re.split(r"(?<=[.!?]) ", text) if len(s) >= 60}


@pytest.mark.parametrize("name", available())
def test_recipe_data_has_no_demo_question_and_no_language_reference_text(tmp_path, name):
    """The guard, for every shipped recipe: its data (each part cut to 40) shares no question with the demo
    and language-reference question sets, and no long sentence with the CPython language reference
    (pydoc_data.topics), the demo corpus or the demo passages; every record is from build_mix's generators."""
    from pydoc_data.topics import topics

    r = parse_recipe(_small(n=40, name=name), "small")
    built = [build_data(r, tmp_path, stage=k) for k in range(1, len(r.stages) + 1)]
    rows = [json.loads(line) for data in built for line in data.read_text().splitlines()]
    check_sources(rows)
    assert {r["source"].split(":")[0] for r in rows} == {"synth", "stdlib", "prose"}

    asked = {r["question"].strip().lower() for r in rows}
    reference: set[str] = set()
    for name in ("demo.jsonl", "langref_qa.jsonl", "langref_names_qa.jsonl"):
        text = files("turborag").joinpath(f"data/{name}").read_text()
        held = [json.loads(line) for line in text.splitlines()]
        assert not asked & {h["question"].strip().lower() for h in held}, name
        for h in held:
            reference |= {s for c in h.get("contexts", []) for s in _sentences(c)}
    for name, text in topics.items():
        if name not in LIBRARY_TOPICS:
            reference |= _sentences(text)
    for path in files("turborag").joinpath("data/corpus").iterdir():
        if path.name.endswith(".md"):
            reference |= _sentences(path.read_text())
    assert len(reference) > 1000  # the language reference really was read
    passages = {s for r in rows for c in r["contexts"] for s in _sentences(c)}
    assert not passages & reference
    texts = [" ".join(c.split()) for r in rows for c in r["contexts"]]
    few = sorted(reference, key=len)[-20:]  # and the 20 longest sentences, as plain substrings
    assert not any(s in t for s in few for t in texts)
    with pytest.raises(ValueError, match="not from"):
        check_sources([{"source": "rgb:en"}])


# ---------------------------------------------------------------------------------------------------------
# the command line


def test_cli_takes_exactly_one_of_data_and_recipe(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("")
    for args in ([], ["--data", str(path), "--recipe", SHIPPED]):
        r = runner.invoke(app, ["finetune", "--out", str(tmp_path / "o"), *args])
        assert r.exit_code == 2 and "exactly one of --data" in r.output, r.output
    r = runner.invoke(app, ["finetune", "--out", str(tmp_path / "o"), "--recipe", "nope"])
    assert r.exit_code == 2 and "unknown recipe 'nope'" in r.output
    r = runner.invoke(
        app, ["finetune", "--out", str(tmp_path / "o"), "--recipe", SHIPPED, "--init-adapter", str(tmp_path)]
    )
    assert r.exit_code == 2 and "does not go with --init-adapter" in r.output
    assert not (tmp_path / "o").exists()


def test_cli_recipe_run_resumes_without_rebuilding_and_records_overrides(
    tmp_path, tiny_model_dir, monkeypatch
):
    """Killed after its first checkpoint, the same command resumes at step 1 with the data of the first run;
    --steps (given) is recorded as an override, the defaults of options not given are not; the adapter
    records the recipe's name and hash."""
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    path = tmp_path / "small.json"
    path.write_text(json.dumps(_small(model=tiny_model_dir, steps=4)))
    out = tmp_path / "run"
    args = ["finetune", "--recipe", str(path), "--out", str(out), "--steps", "2"]

    class Killed(Exception):
        pass

    real_save = train.save_checkpoint

    def save_then_die(out_dir, step, *a, **k):
        real_save(out_dir, step, *a, **k)
        raise Killed

    monkeypatch.setattr(train, "save_checkpoint", save_then_die)
    first = runner.invoke(app, args)
    assert isinstance(first.exception, Killed), first.output
    assert "building data: part 1 of 3" in first.output and "training: step 0 of 2" in first.output
    data = (out / "data.jsonl").read_bytes()

    monkeypatch.setattr(train, "save_checkpoint", real_save)
    _refuse_to_build(monkeypatch)
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "not rebuilt" in second.output and "training: step 1 of 2 (resuming" in second.output
    assert (out / "data.jsonl").read_bytes() == data
    steps = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # step 1 from the first run, step 2 from the second: nothing trained twice
    record = json.loads((out / "recipe.json").read_text())
    assert record["overrides"] == {"steps": 2}
    meta = json.loads((out / "adapter" / "turborag_finetune.json").read_text())
    r = load_recipe(str(path))
    assert (meta["recipe"], meta["recipe_hash"]) == (r.name, r.hash) == (SHIPPED, record["hash"])
    assert meta["steps"] == 2 and meta["rank"] == 4 and meta["model"] == tiny_model_dir
    assert (out / "model" / "config.json").exists() and Path(meta["data"]) == out / "data.jsonl"
    # the recipe's answering settings are recorded with the adapter and the merged model, and read back
    merged = json.loads((out / "model" / "turborag_finetune.json").read_text())
    assert meta["name_check"] is True and merged["name_check"] is True
    assert name_check(out / "adapter") and name_check(out / "model")


def test_cli_recipe_whose_data_does_not_reproduce_fails_before_training(tmp_path, tiny_model_dir):
    path = tmp_path / "drifted.json"
    path.write_text(json.dumps({**_small(model=tiny_model_dir), "data_sha256": "0" * 64}))
    out = tmp_path / "run"
    r = runner.invoke(app, ["finetune", "--recipe", str(path), "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "error: recipe gemma-3-270m-turbo: its data does not reproduce" in r.stderr
    assert f"records data_sha256 {'0' * 64}" in r.stderr
    assert (out / "data.jsonl.mismatch").is_file() and not (out / "data.jsonl").exists()
    assert not (out / "latest").exists() and not (out / "log.jsonl").exists()  # nothing trained


# ---------------------------------------------------------------------------------------------------------
# recipes in stages


def _staged(model: str = BASE_MODEL) -> dict:
    """A two-stage recipe: the small shipped recipe as stage 1, then a stage on one more part of its own."""
    one = _small(model=model)
    second = {
        "about": "a narrower mix, from stage 1's adapter",
        "data": [{**one["data"][0], "seed": 999}],
        "train": {**one["train"], "steps": 2, "lr": 5e-4},
    }
    first = {"data": one.pop("data"), "train": one.pop("train")}
    return {**one, "stages": [first, second]}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(data=[]), "'data' goes inside each stage, not beside 'stages'"),
        (lambda r: r.update(data_sha256="0" * 64), "'data_sha256' goes inside each stage"),
        (lambda r: r.update(stages=[]), "stages must be a non-empty list"),
        (lambda r: r["stages"].append("x"), "stage 3: must be an object of"),
        (lambda r: r["stages"][1].update(colour="red"), "stage 2: unknown key 'colour'"),
        (lambda r: r["stages"][1].pop("train"), "stage 2: missing key 'train'"),
        (lambda r: r["stages"][0]["train"].pop("rank"), "stage 1, train: missing key 'rank'"),
        (lambda r: r["stages"][1]["data"][0].update(seed=101), "share a seed"),
        (lambda r: r["stages"][1].update(data_sha256="F"), "stage 2: data_sha256 must be 64 lower-case"),
    ],
)
def test_invalid_stages_are_refused_with_the_stage_named(edit, message):
    raw = _staged()
    edit(raw)
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_recipe(raw, "test")


def test_stages_train_in_order_from_the_adapter_before(tmp_path):
    raw = _staged()
    r = parse_recipe(raw, "staged")
    assert len(r.stages) == 2 and r.parts == r.stages[1].parts and r.train["lr"] == 5e-4
    first, last = train_config(r, tmp_path, stage=1), train_config(r, tmp_path)
    assert (first.out, first.init_adapter) == (str(tmp_path / "stage-1"), None)
    assert (last.out, last.init_adapter) == (str(tmp_path), str(tmp_path / "stage-1" / "adapter"))
    assert last.data == str(tmp_path / "data.jsonl") and last.lr == 5e-4 and first.lr == 1e-3
    assert train_config(r, tmp_path, {"steps": 7}, stage=1).steps == 7  # an override is every stage's
    # the data_sha256 a stage records is left out of the hash, like a one-stage recipe's
    raw["stages"][1]["data_sha256"] = "0" * 64
    assert parse_recipe(raw, "recorded").hash == r.hash
    raw["stages"][1]["train"]["lr"] = 1e-4
    assert parse_recipe(raw, "other").hash != r.hash


def test_cli_staged_recipe_resumes_in_the_stage_it_stopped(tmp_path, tiny_model_dir, monkeypatch):
    """Killed after stage 2's first checkpoint, the same command skips stage 1 (done) and resumes stage 2
    from its checkpoint; stage 2 starts from stage 1's adapter; the recipe's adapter is OUT/adapter."""
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    path = tmp_path / "staged.json"
    path.write_text(json.dumps(_staged(model=tiny_model_dir)))
    out = tmp_path / "run"
    args = ["finetune", "--recipe", str(path), "--out", str(out)]

    class Killed(Exception):
        pass

    real_save, real_init = train.save_checkpoint, train.load_adapter_weights
    inits = []

    def save_then_die(out_dir, step, *a, **k):
        real_save(out_dir, step, *a, **k)
        if Path(out_dir) == out:  # stage 2 trains in OUT itself
            raise Killed

    def init(model, adapter, rank):
        inits.append(Path(adapter))
        real_init(model, adapter, rank)

    monkeypatch.setattr(train, "save_checkpoint", save_then_die)
    monkeypatch.setattr(train, "load_adapter_weights", init)
    first = runner.invoke(app, args)
    assert isinstance(first.exception, Killed), first.output
    assert "stage 1 of 2: building data: part 1 of 3" in first.output
    assert "stage 2 of 2: building data: part 1 of 1" in first.output
    assert inits == [out / "stage-1" / "adapter"]
    assert (out / "stage-1" / "adapter" / "adapter_model.safetensors").is_file()

    monkeypatch.setattr(train, "save_checkpoint", real_save)
    _refuse_to_build(monkeypatch)
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "stage 1 of 2: trained before" in second.output
    assert "stage 2 of 2: training: step 1 of 2 (resuming" in second.output
    assert inits == [out / "stage-1" / "adapter"] * 2
    steps = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    meta = json.loads((out / "adapter" / "turborag_finetune.json").read_text())
    assert meta["init_adapter"] == str(out / "stage-1" / "adapter") and meta["name_check"] is True
    record = json.loads((out / "recipe.json").read_text())
    assert record["data"]["examples"] == 2 and record["data of stage 1"]["examples"] == 6
