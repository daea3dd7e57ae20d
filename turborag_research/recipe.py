"""A training recipe: an adapter's data and training in one file, built and trained by one resumable command.

The shipped adapter was trained in seven stages, each a `turborag data mix` with its own options and seed
and a `turborag finetune --init-adapter` on the stage before, replayed by hand across sessions. A recipe
states a whole run as data (turborag_research/recipes/NAME.json, or any JSON file):

- `model`: the base model the run starts from (a recipe always trains from the base, never an adapter);
- `data`: a list of parts, each the keyword arguments of one `mix.build_mix` call with its own `n` and
  `seed`, plus an optional `about` saying why the part is there. The parts are concatenated in order (the
  trainer shuffles every epoch), so one recipe can mix several mixes;
- `train`: the training settings (the TrainConfig fields in TRAIN_KEYS, and optionally those in
  OPTIONAL_TRAIN_KEYS);
- `name`, an optional `description`, and an optional `data_sha256`: the sha256 of the data.jsonl the
  recipe builds;
- or, instead of `data`, `train` and `data_sha256`, `stages`: a list of objects with those three keys (and
  an optional `about`), trained in order, each stage from the adapter of the one before (the first from
  the base model). A stage on a narrower mix costs far fewer steps than a run from zero, and each stage
  can train in its own dtype. Stage k of n trains in OUT/stage-k, the last in OUT itself, so a recipe's
  adapter is always OUT/adapter;
- an optional `answering`: the engine settings the trained adapter records in its turborag_finetune.json
  (`name_check`, `abstain_threshold`; ANSWERING_KEYS). They are chosen after training, on held-out sets,
  so they are written when training ends and, like `data_sha256`, left out of the recipe's hash: recording
  them neither makes another recipe nor stops a run from resuming.

Unknown keys are errors rather than ignored, so a typo never silently trains something else; the build_mix
arguments are checked against its signature when the recipe is loaded, so a recipe can use an argument as
soon as build_mix has it.

`data_sha256` replaces freezing the generators' code. The generators (synth, realtext, prose, docstyle,
mix) may change; a recipe that records the hash of its data says exactly which data it trained on, and
building it checks the file written against that hash: when they differ the build fails with both hashes,
the data is kept as data.jsonl.mismatch (never as data.jsonl, so no rerun trains on it), and the recipe's
data no longer reproduces until the generators are fixed or the recipe records the new hash (then train
in a new --out).
The realtext and prose parts read the standard library's docstrings, so the hash also pins the Python
version the data was built with.

`turborag finetune --recipe NAME --out DIR` writes DIR/recipe.json (the recipe, its hash and the command
line's overrides), builds DIR/data.jsonl once, and trains; rerunning the command resumes from DIR's last
checkpoint without rebuilding the data. A DIR that holds another recipe's data or checkpoints is refused,
so two recipes never mix. The recipe's hash leaves `data_sha256` out: the check says whether the recipe's
data reproduces, it is not part of what the recipe asks for (so recording it neither makes another recipe
nor stops a run begun before it was recorded from resuming).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from turborag.core.files import sha256_file, write_json
from turborag.train.finetune import TrainConfig
from turborag_research.mix import build_mix
from turborag_research.synth import write_jsonl

TOP_KEYS = ("name", "description", "model", "data", "train", "data_sha256", "stages", "answering")
STAGE_KEYS = ("about", "data", "train", "data_sha256")  # a stage of `stages` (one-stage recipes: top level)
# Outside the recipe's hash: what it checks (data_sha256) and what is chosen after training (answering).
UNHASHED_KEYS = ("data_sha256", "answering")
# The engine settings an adapter records for serving (core/model.py reads them from turborag_finetune.json).
ANSWERING_KEYS = ("name_check", "abstain_threshold")
REQUIRED_KEYS = ("name", "model")
TRAIN_KEYS = ("steps", "batch", "lr", "warmup", "rank", "save_every", "keep_every", "seed", "dtype")
# Optional: the trainer's passage truncation (TrainConfig's default when absent; the tests make it short).
OPTIONAL_TRAIN_KEYS = ("max_passage_tokens",)
# What the command line may override besides TRAIN_KEYS (the TrainConfig fields of `turborag finetune`).
OVERRIDE_KEYS = TRAIN_KEYS + ("model", "lora", "causal", "positions", "template")
DTYPES = ("auto", "float32", "bfloat16")
# The generators build_mix draws on (invented facts, stdlib docstrings, plain English over them): a record
# from anywhere else (an evaluation set, the demo corpus) is refused before the data is written.
DATA_SOURCES = ("synth", "stdlib", "prose")


@dataclass(frozen=True)
class Stage:
    """One training run of a recipe: its data parts and training settings."""

    parts: list[dict]  # build_mix keyword arguments, `about` removed
    train: dict
    data_sha256: str | None = None  # the sha256 its data.jsonl must have, when the recipe records it

    @property
    def examples(self) -> int:
        return sum(part["n"] for part in self.parts)


@dataclass(frozen=True)
class Recipe:
    name: str
    model: str
    stages: list[Stage]  # in training order; one for a recipe without `stages`
    content: dict  # the recipe as loaded, for OUT/recipe.json
    source: str  # the name or path it was loaded from
    hash: str  # sha256 of the canonical JSON (sorted keys) less the data_sha256s and `answering`
    answering: dict | None = None  # settings the adapter records for the engine (ANSWERING_KEYS)

    # The last stage's (the only one's) data and settings: those of the adapter the recipe makes.
    @property
    def parts(self) -> list[dict]:
        return self.stages[-1].parts

    @property
    def train(self) -> dict:
        return self.stages[-1].train

    @property
    def data_sha256(self) -> str | None:
        return self.stages[-1].data_sha256

    @property
    def examples(self) -> int:
        return self.stages[-1].examples


def available() -> list[str]:
    """Names of the recipes shipped in the package."""
    folder = files("turborag_research").joinpath("recipes")
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def load_recipe(spec: str) -> Recipe:
    """A recipe by shipped name (`gemma-3-270m-turbo`) or by path to a JSON file, validated."""
    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        if not path.is_file():
            raise ValueError(f"no such recipe file: {spec}")
        text = path.read_text(encoding="utf-8")
    else:
        entry = files("turborag_research").joinpath(f"recipes/{spec}.json")
        if not entry.is_file():
            raise ValueError(
                f"unknown recipe {spec!r}: the shipped ones are {', '.join(available())} "
                "(or give the path of a JSON file)"
            )
        text = entry.read_text(encoding="utf-8")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"recipe {spec}: not valid JSON ({e})") from None
    return parse_recipe(obj, spec)


def parse_recipe(obj: object, source: str = "<dict>") -> Recipe:
    """Validate a recipe's JSON object; every problem is a ValueError that names the key."""
    where = f"recipe {source}"
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: must be a JSON object")
    _known(obj, TOP_KEYS, where)
    missing = [k for k in REQUIRED_KEYS if k not in obj]
    if missing:
        raise ValueError(f"{where}: missing key {missing[0]!r}")
    for key in ("name", "model"):
        if not isinstance(obj[key], str) or not obj[key]:
            raise ValueError(f"{where}: {key} must be a non-empty string, got {obj[key]!r}")
    if "stages" in obj:
        beside = [k for k in ("data", "train", "data_sha256") if k in obj]
        if beside:
            raise ValueError(f"{where}: {beside[0]!r} goes inside each stage, not beside 'stages'")
        if not isinstance(obj["stages"], list) or not obj["stages"]:
            raise ValueError(f"{where}: stages must be a non-empty list of {{data, train}} objects")
        stages = []
        for i, stage in enumerate(obj["stages"], 1):
            if not isinstance(stage, dict):
                raise ValueError(f"{where}, stage {i}: must be an object of {', '.join(STAGE_KEYS)}")
            _known(stage, STAGE_KEYS, f"{where}, stage {i}")
            stages.append(_stage(stage, f"{where}, stage {i}"))
    else:
        stages = [_stage(obj, where)]
    seeds = [part["seed"] for stage in stages for part in stage.parts]
    if len(set(seeds)) < len(seeds):
        raise ValueError(f"{where}: two data parts share a seed; each needs its own (else they draw alike)")
    answering = _answering(obj["answering"], f"{where}, answering") if "answering" in obj else None
    stated = {k: v for k, v in obj.items() if k not in UNHASHED_KEYS}
    if "stages" in stated:
        stated["stages"] = [{k: v for k, v in st.items() if k not in UNHASHED_KEYS} for st in obj["stages"]]
    canonical = json.dumps(stated, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return Recipe(
        name=obj["name"],
        model=obj["model"],
        stages=stages,
        content=obj,
        source=source,
        hash=hashlib.sha256(canonical.encode()).hexdigest(),
        answering=answering,
    )


def _stage(obj: dict, where: str) -> Stage:
    """A stage's data parts, training settings and data_sha256 (from a stage, or a one-stage recipe)."""
    for key in ("data", "train"):
        if key not in obj:
            raise ValueError(f"{where}: missing key {key!r}")
    if not isinstance(obj["data"], list) or not obj["data"]:
        raise ValueError(f"{where}: data must be a non-empty list of build_mix arguments")
    parts = [_part(part, f"{where}, data part {i}") for i, part in enumerate(obj["data"], 1)]
    if not isinstance(obj["train"], dict):
        raise ValueError(f"{where}: train must be an object of training settings")
    _known(obj["train"], TRAIN_KEYS + OPTIONAL_TRAIN_KEYS, f"{where}, train")
    missing = [k for k in TRAIN_KEYS if k not in obj["train"]]
    if missing:
        raise ValueError(f"{where}, train: missing key {missing[0]!r}")
    _check_train(obj["train"], f"{where}, train")
    expected = obj.get("data_sha256")
    if "data_sha256" in obj and not (isinstance(expected, str) and re.fullmatch(r"[0-9a-f]{64}", expected)):
        raise ValueError(
            f"{where}: data_sha256 must be 64 lower-case hex digits (a sha256), got {expected!r}"
        )
    return Stage(parts=parts, train=dict(obj["train"]), data_sha256=expected)


def _answering(obj: object, where: str) -> dict:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: must be an object of {', '.join(ANSWERING_KEYS)}")
    _known(obj, ANSWERING_KEYS, where)
    if "name_check" in obj and not isinstance(obj["name_check"], bool):
        raise ValueError(f"{where}: name_check must be true or false, got {obj['name_check']!r}")
    t = obj.get("abstain_threshold", 0.5)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 1:
        raise ValueError(f"{where}: abstain_threshold must be a number in (0, 1], got {t!r}")
    return dict(obj)


def _known(obj: dict, keys: tuple[str, ...], where: str) -> None:
    unknown = [k for k in obj if k not in keys]
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(keys)})")


def _part(part: object, where: str) -> dict:
    """One data part: build_mix's keyword arguments, checked against its signature now (not at build time),
    so a recipe naming an argument build_mix lacks fails before anything is built."""
    if not isinstance(part, dict):
        raise ValueError(f"{where}: must be an object of build_mix arguments")
    accepted = list(inspect.signature(build_mix).parameters)
    args = {k: v for k, v in part.items() if k != "about"}
    unknown = [k for k in args if k not in accepted]
    if unknown:
        raise ValueError(
            f"{where}: build_mix takes no argument {unknown[0]!r} (it takes {', '.join(accepted)}; "
            "'about' is a note)"
        )
    for key, low in (("n", 1), ("seed", 0)):
        if key not in args:
            raise ValueError(f"{where}: needs its own {key!r}")
        _int(args[key], low, f"{where}: {key}")
    return args


def _int(value: object, low: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{what} must be an integer of at least {low}, got {value!r}")


def _check_train(train: dict, where: str) -> None:
    for key in ("steps", "batch", "rank", "save_every", "max_passage_tokens"):
        if key in train:
            _int(train[key], 1, f"{where}: {key}")
    for key in ("warmup", "keep_every", "seed"):
        if key in train:
            _int(train[key], 0, f"{where}: {key}")
    lr = train.get("lr", 1.0)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"{where}: lr must be a positive number, got {lr!r}")
    if train.get("dtype", "auto") not in DTYPES:
        raise ValueError(f"{where}: dtype must be one of {', '.join(DTYPES)}, got {train['dtype']!r}")


# ---------------------------------------------------------------------------------------------------------
# the run's folder: OUT/recipe.json, OUT/data.jsonl


def stage_dir(recipe: Recipe, out_dir: str | Path, stage: int) -> Path:
    """Where stage `stage` (1-based) trains: OUT/stage-k for all but the last, OUT itself for the last."""
    out = Path(out_dir)
    return out if stage == len(recipe.stages) else out / f"stage-{stage}"


def build_data(
    recipe: Recipe, out_dir: str | Path, say: Callable[[str], None] = lambda _: None, stage: int | None = None
) -> Path:
    """The data.jsonl of one stage (the last by default) in its folder (stage_dir), built once: a rerun finds
    it and checks that it is this recipe's.

    OUT/recipe.json is written first (the recipe, its hash), so that a folder holding data or checkpoints
    always says which recipe made them; the data is written to data.jsonl.part and renamed, so a killed
    build leaves no half file, and its sha256 is recorded, so an edited data.jsonl is noticed. When the
    stage records `data_sha256`, data whose hash differs (built now or found) is moved to
    data.jsonl.mismatch and a ValueError names both hashes: nothing trains on data the recipe did not state.
    """
    k = len(recipe.stages) if stage is None else stage
    current = recipe.stages[k - 1]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = _claim(recipe, out)
    folder = stage_dir(recipe, out, k)
    folder.mkdir(exist_ok=True)
    data = folder / "data.jsonl"
    entry = "data" if k == len(recipe.stages) else f"data of stage {k}"
    if data.is_file():
        digest = sha256_file(data)
        if record.get(entry, {}).get("sha256", digest) != digest:
            raise ValueError(f"{data} is not the data recipe {recipe.name} built (it was changed since)")
        _check_digest(recipe, current, data, digest)
        say(f"data: {data} was built before, not rebuilt")
    else:
        rows = []
        parts = current.parts
        for i, part in enumerate(parts, 1):
            say(f"building data: part {i} of {len(parts)}, {part['n']} examples (seed {part['seed']})")
            try:
                rows += build_mix(**part)
            except ValueError as e:
                where = f", stage {k}" if len(recipe.stages) > 1 else ""
                raise ValueError(f"recipe {recipe.source}{where}, data part {i}: {e}") from None
        check_sources(rows)
        tmp = data.with_name(data.name + ".part")
        write_jsonl(rows, tmp)
        digest = sha256_file(tmp)
        _check_digest(recipe, current, tmp, digest)
        os.replace(tmp, data)
        say(f"data: {len(rows)} examples written to {data}")
    if current.data_sha256 is not None:
        say(f"data: sha256 {digest}, the one the recipe records")
    with data.open(encoding="utf-8") as f:
        record[entry] = {"examples": sum(1 for line in f if line.strip()), "sha256": digest}
    write_json(out / "recipe.json", record)
    return data


MISMATCH = "data.jsonl.mismatch"  # where data that does not hash to the recipe's data_sha256 is kept


def _check_digest(recipe: Recipe, stage: Stage, path: Path, digest: str) -> None:
    """Nothing when the stage records no data_sha256 or `digest` is it; else move the file to
    data.jsonl.mismatch beside it (kept, to compare with good data) and raise a ValueError naming both
    hashes."""
    if stage.data_sha256 is None or digest == stage.data_sha256:
        return
    kept = path.with_name(MISMATCH)
    os.replace(path, kept)
    raise ValueError(
        f"recipe {recipe.name}: its data does not reproduce: the data built has sha256 {digest}, the recipe "
        f"records data_sha256 {stage.data_sha256}. The generators (or the Python version, whose docstrings "
        f"the stdlib parts read) changed since the recipe was recorded; the data is kept as {kept} (not "
        "trained on). Fix the generators, or record the new hash in the recipe and train in a new --out."
    )


def check_sources(rows: list[dict]) -> None:
    """Refuse a record that build_mix's own generators did not make (the exclusion of evaluation text
    rests on them: invented facts and the train split of the standard library's docstrings)."""
    for row in rows:
        if str(row.get("source", "")).split(":", 1)[0] not in DATA_SOURCES:
            raise ValueError(f"a training record from {row.get('source')!r}, not from {DATA_SOURCES}")


def _claim(recipe: Recipe, out: Path) -> dict:
    """OUT's record of its recipe; a folder that holds data or checkpoints of another run is an error."""
    path = out / "recipe.json"
    started = any((out / name).exists() for name in ("data.jsonl", "latest", "stage-1"))
    if path.is_file():
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("hash") == recipe.hash:
            return record
        if started:
            raise ValueError(
                f"{out} holds a run of recipe {record.get('recipe')!r} (hash {str(record.get('hash'))[:12]}),"
                f" not of {recipe.name!r} (hash {recipe.hash[:12]}): use another --out"
            )
    elif started:
        raise ValueError(f"{out} holds data or checkpoints that no recipe made: use another --out")
    record = {"recipe": recipe.name, "hash": recipe.hash, "source": recipe.source, "content": recipe.content}
    write_json(out / "recipe.json", record)
    return record


def record_overrides(out_dir: str | Path, overrides: dict) -> None:
    """Note in OUT/recipe.json the settings the latest command line gave over the recipe's."""
    out = Path(out_dir)
    record = json.loads((out / "recipe.json").read_text(encoding="utf-8"))
    record["overrides"] = overrides
    write_json(out / "recipe.json", record)


def record_answering(recipe: Recipe, out_dir: str | Path) -> None:
    """Write the recipe's `answering` settings into the turborag_finetune.json of the run's adapter and
    merged model (OUT/adapter, OUT/model), beside what the trainer wrote, so either answers as the recipe
    says with no step by hand."""
    if not recipe.answering:
        return
    for folder in ("adapter", "model"):
        path = Path(out_dir) / folder / "turborag_finetune.json"
        if not path.exists():
            continue
        write_json(path, {**json.loads(path.read_text(encoding="utf-8")), **recipe.answering})


def train_config(
    recipe: Recipe, out_dir: str | Path, overrides: dict | None = None, stage: int | None = None
) -> TrainConfig:
    """The TrainConfig of one stage of the recipe's run (the last by default), in its folder (stage_dir), on
    its data.jsonl: the first stage from the base model, each later one from the adapter of the stage before,
    with the stage's settings under `overrides` (keys of OVERRIDE_KEYS; they apply to every stage). `dtype`
    may be "auto": the caller resolves it for its device, as `turborag finetune` does for its own --dtype."""
    overrides = overrides or {}
    unknown = [k for k in overrides if k not in OVERRIDE_KEYS]
    if unknown:
        raise ValueError(f"a recipe's run cannot override {unknown[0]!r} (only {', '.join(OVERRIDE_KEYS)})")
    k = len(recipe.stages) if stage is None else stage
    settings = {"model": recipe.model, **recipe.stages[k - 1].train, **overrides}
    _check_train(settings, f"recipe {recipe.source} with overrides")
    folder = stage_dir(recipe, out_dir, k)
    return TrainConfig(
        data=str(folder / "data.jsonl"),
        out=str(folder),
        alpha=2 * settings["rank"],
        init_adapter=str(stage_dir(recipe, out_dir, k - 1) / "adapter") if k > 1 else None,
        recipe=recipe.name,
        recipe_hash=recipe.hash,
        **settings,
    )
