"""`turborag finetune`: the cache-aware fine-tune (the work is in train/finetune.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from turborag.cli.common import DeviceOpt, TemplateOpt, fail
from turborag.core.defaults import BASE_MODEL


def finetune(
    data: Path = typer.Option(..., "--data", help="training JSONL: {question, answers, contexts} per line"),
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
    device: str = DeviceOpt,
    dtype: str = typer.Option(
        "auto",
        "--dtype",
        help="base weights' dtype: auto (bf16 where the hardware has it, else fp32), float32, bfloat16; "
        "LoRA weights and optimizer state stay fp32",
    ),
    template: str = TemplateOpt,
) -> None:
    """Cache-aware fine-tune: trains through the serving path (independent chunks, reordered positions)."""
    from turborag.core.model import ModelError, dtype_name, load_model, resolve_device, resolve_dtype
    from turborag.train.finetune import TrainConfig
    from turborag.train.finetune import finetune as run

    if not data.is_file():
        fail(f"no such file: {data}")
    if init_adapter is not None and not lora:
        fail("--init-adapter continues a LoRA adapter: it does not go with --full")
    if positions not in ("reordered", "composite"):
        fail(f"unknown positions {positions!r}: use reordered or composite")
    if dtype not in ("auto", "float32", "bfloat16"):
        fail(f"unknown --dtype {dtype!r}: use auto, float32 or bfloat16")
    if not lora and dtype == "bfloat16":
        fail("full fine-tuning trains in fp32: use --dtype float32 (or auto) with --full")
    try:
        torch_dtype = resolve_dtype("float32" if not lora else dtype, resolve_device(device))
    except (ModelError, ValueError) as e:
        fail(str(e))
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
        dtype=dtype_name(torch_dtype),
        keep_every=keep_every,
        init_adapter=str(init_adapter) if init_adapter else None,
        warmup=warmup,
    )
    try:
        lm = load_model(model, device, torch_dtype)
        dest = run(lm, cfg)
    except (ModelError, ValueError) as e:
        fail(str(e))
    typer.echo(f"fine-tuned model written to {dest} (use it with --model {dest})", err=True)
