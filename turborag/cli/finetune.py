"""`turborag finetune`: the cache-aware fine-tune (the work is in train/finetune.py), on a data file or as a
recipe that builds its own data (turborag_research/recipe.py: the research generators, imported only by
the --recipe branch, when it runs)."""

from __future__ import annotations

import gc
from pathlib import Path

import typer

from turborag.cli.common import DeviceOpt, TemplateOpt, fail
from turborag.core.defaults import BASE_MODEL


def finetune(
    ctx: typer.Context,
    data: Path = typer.Option(None, "--data", help="training JSONL: {question, answers, contexts} per line"),
    recipe: str = typer.Option(
        None,
        "--recipe",
        help="instead of --data: a recipe (a shipped name such as gemma-3-270m-turbo, or a JSON file) that "
        "builds its data in OUT and trains from the base model; options given with it override its settings",
    ),
    out: Path = typer.Option(..., "--out", help="output folder (checkpoints, adapter, merged model)"),
    model: str = typer.Option(BASE_MODEL, "--model", help="model to start from (default: the base model)"),
    lora: bool = typer.Option(True, "--lora/--full", help="LoRA adapter (default) or full fine-tuning"),
    causal: bool = typer.Option(False, "--causal", help="ordinary causal mask (the naive-RAG baseline)"),
    positions: str = typer.Option("reordered", help="reordered or composite (turbo training only)"),
    steps: int = typer.Option(500, min=1),
    batch: int = typer.Option(4, min=1, help="examples per optimizer step"),
    lr: float = typer.Option(None, help="learning rate (default 2e-4 LoRA, 2e-5 full)"),
    rank: int = typer.Option(16, min=1, help="LoRA rank"),
    save_every: int = typer.Option(25, min=1, help="checkpoint every N steps (resume picks up from there)"),
    seed: int = typer.Option(0),
    keep_every: int = typer.Option(
        0, min=0, help="also keep the adapter every N steps under OUT/snapshots/ (for a learning curve)"
    ),
    init_adapter: Path = typer.Option(
        None, "--init-adapter", help="start from this LoRA adapter (a second stage on another mix)"
    ),
    warmup: int = typer.Option(20, min=0, help="learning-rate warm-up steps"),
    objective: str = typer.Option(
        "answer",
        help="answer: cross-entropy on the data's answers; distill: turbo learns to answer what the same "
        "model answers in full mode (its greedy answer and next-token distributions; no labels used)",
    ),
    side: str = typer.Option(
        "both",
        help="both: the chunk caches pass through the adapter too (a store must be recomputed for it); "
        "query: only question and answer tokens do, so the base model's store serves it unchanged",
    ),
    teacher: Path = typer.Option(
        None, "--teacher", help="distill: the teachers' JSONL to reuse and extend (default OUT/teacher.jsonl)"
    ),
    teacher_tokens: int = typer.Option(48, min=1, help="distill: the teacher's answer is cut at N tokens"),
    device: str = DeviceOpt,
    dtype: str = typer.Option(
        "auto",
        "--dtype",
        help="base weights' dtype: auto (bf16 where the hardware has it, else fp32), float32, bfloat16; "
        "LoRA weights and optimizer state stay fp32",
    ),
    template: str = TemplateOpt,
) -> None:
    """Cache-aware fine-tune: trains through the serving path (independent chunks, reordered positions).

    With --recipe the same command builds OUT/data.jsonl first (each stage's, for a recipe in stages) and,
    run again, resumes where it stopped."""
    from turborag.train.finetune import TrainConfig

    if (data is None) == (recipe is None):
        fail("give exactly one of --data FILE (training JSONL) and --recipe NAME_OR_PATH (builds its data)")
    if recipe is not None:
        if init_adapter is not None:
            fail("--recipe trains from its base model: it does not go with --init-adapter")
        _run_recipe(ctx, recipe, out, device)
        return
    if not data.is_file():
        fail(f"no such file: {data}")
    cfg = TrainConfig(
        data=str(data),
        out=str(out),
        model=model,
        lora=lora,
        causal=causal,
        positions=positions,
        steps=steps,
        batch=batch,
        lr=lr or (2e-4 if lora else 2e-5),
        rank=rank,
        alpha=2 * rank,
        save_every=save_every,
        seed=seed,
        template=template,
        dtype=dtype,
        keep_every=keep_every,
        init_adapter=str(init_adapter) if init_adapter else None,
        warmup=warmup,
        objective=objective,
        side=side,
        teacher=str(teacher) if teacher else None,
        teacher_tokens=teacher_tokens,
    )
    dest = _train(cfg, device, _checked(cfg, device))
    typer.echo(f"fine-tuned model written to {dest} (use it with --model {dest})", err=True)


def _train(cfg, device: str, torch_dtype) -> Path:
    """Load the model in `torch_dtype` (from `_checked`) and run (or resume) one training; a bad model or
    setting is a clean failure."""
    from turborag.core.model import ModelError, load_model
    from turborag.train.finetune import finetune as run

    try:
        return run(load_model(cfg.model, device, torch_dtype), cfg)
    except (ModelError, ValueError) as e:
        fail(str(e))


def _run_recipe(ctx: typer.Context, recipe: str, out: Path, device: str) -> None:
    """Build each stage's data and train it, in order; run again, skip the stages that are done and resume
    the one that was stopped. Each stage loads the base model afresh (LoRA wraps it in place)."""
    from turborag.train.finetune import resume_step
    from turborag_research import recipe as recipes

    rec, overrides = _recipe_config(ctx, recipe)
    n = len(rec.stages)
    for k in range(1, n + 1):

        def say(line: str, k: int = k) -> None:
            typer.echo(f"recipe {rec.name}: " + (f"stage {k} of {n}: " if n > 1 else "") + line, err=True)

        try:
            cfg = recipes.train_config(rec, out, overrides, stage=k)
        except ValueError as e:
            fail(str(e))
        torch_dtype = _checked(cfg, device)  # a setting that cannot train fails before data is built
        folder = Path(cfg.out)
        if k < n and resume_step(folder) == cfg.steps and (folder / "adapter").is_dir():
            say(f"trained before ({folder / 'adapter'}), not trained again")
            continue
        try:
            recipes.build_data(rec, out, say, stage=k)
        except ValueError as e:
            fail(str(e))
        recipes.record_overrides(out, overrides)
        start = resume_step(folder)
        say(f"training: step {start} of {cfg.steps}" + (" (resuming from the checkpoint)" if start else ""))
        dest = _train(cfg, device, torch_dtype)
        gc.collect()  # the stage's model, before the next one loads
    recipes.record_answering(rec, out)
    typer.echo(f"fine-tuned model written to {dest} (use it with --model {dest})", err=True)


def _recipe_config(ctx: typer.Context, recipe: str):
    """(recipe, overrides) of `--recipe`: only options typed on the command line override the recipe (every
    stage of it), not this command's defaults (told apart by the source's name: typer may bring its own copy
    of click and of its ParameterSource enum)."""
    from turborag_research import recipe as recipes

    overrides = {
        k: ctx.params[k]
        for k in recipes.OVERRIDE_KEYS
        if getattr(ctx.get_parameter_source(k), "name", None) == "COMMANDLINE"
    }
    try:
        return recipes.load_recipe(recipe), overrides
    except ValueError as e:
        fail(str(e))


def _checked(cfg, device: str):
    """The torch dtype of the base weights, once the settings that do not go together are refused (and
    `cfg.dtype` set to its name)."""
    from turborag.core.model import ModelError, dtype_name, resolve_device, resolve_dtype
    from turborag.train.finetune import check_config

    if cfg.init_adapter is not None and not cfg.lora:
        fail("--init-adapter continues a LoRA adapter: it does not go with --full")
    if cfg.positions not in ("reordered", "composite"):
        fail(f"unknown positions {cfg.positions!r}: use reordered or composite")
    try:
        check_config(cfg)
    except ValueError as e:
        fail(str(e))
    if cfg.dtype not in ("auto", "float32", "bfloat16"):
        fail(f"unknown --dtype {cfg.dtype!r}: use auto, float32 or bfloat16")
    if not cfg.lora and cfg.dtype == "bfloat16":
        fail("full fine-tuning trains in fp32: use --dtype float32 (or auto) with --full")
    try:
        torch_dtype = resolve_dtype("float32" if not cfg.lora else cfg.dtype, resolve_device(device))
    except (ModelError, ValueError) as e:
        fail(str(e))
    cfg.dtype = dtype_name(torch_dtype)
    return torch_dtype
