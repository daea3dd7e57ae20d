"""The `turborag` command line (typer). Each command is a thin shell over one module."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from turborag.engine import MODES
from turborag.model import BASE_MODEL, DEFAULT_MODEL, ModelError, turborag_home

app = typer.Typer(
    help="TurboRAG: RAG answers that start fast, from precomputed chunk KV caches.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(help="Data sets for development and evaluation.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks (ratios measured side by side in one run).", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(bench_app, name="bench")
console = Console(stderr=True)


def stdout() -> Console:
    """Tables on stdout; when piped (no terminal width), wide enough that columns are not cut."""
    c = Console()
    return c if c.is_terminal else Console(width=160)


ModelOpt = typer.Option(
    DEFAULT_MODEL,
    "--model",
    help="gemma-3-270m-turbo, gemma-3-270m (base), an HF model or adapter folder, a .gguf",
)
DeviceOpt = typer.Option("cpu", "--device", help="cpu, cuda, cuda:N or auto")
TemplateOpt = typer.Option(
    "auto", "--template", help="prompt template: auto (chat if the model has one), plain, chat"
)


def fail(message: str, code: int = 2) -> None:
    """One clear line on stderr, no traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def int_list(value: str, option: str) -> list[int]:
    """'512,2048' -> [512, 2048]; anything else is one clear error line."""
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        fail(f"{option} must be comma-separated positive integers, got {value!r}")
    return out


def _parse_modes(modes: str) -> list[str]:
    out = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in out if m.split("@", 1)[0] not in MODES]
    if bad or not out:
        fail(f"unknown mode {', '.join(bad) or '(none)'}: use one or more of {', '.join(MODES)}")
    return out


def _group_by_model(mode_list: list[str], default_model: str) -> dict[str, list[str]]:
    """`MODE` runs on --model, `MODE@MODEL` on another model: {model: [modes]} in first-seen order."""
    groups: dict[str, list[str]] = {}
    for m in mode_list:
        mode, _, spec = m.partition("@")
        groups.setdefault(spec or default_model, []).append(mode)
    return groups


def _engine(model: str, device: str, store: Path | None, template: str, store_dtype: str = "float16"):
    from turborag.engine import Engine
    from turborag.model import load_model
    from turborag.store import KVStore

    try:
        with console.status(f"loading {model}"):
            lm = load_model(model, device)
        return Engine(lm, KVStore(store or turborag_home() / "eval-store", store_dtype), template)
    except ModelError as e:
        fail(str(e))
    except ValueError as e:
        fail(str(e))


@app.command()
def demo(
    model: str = ModelOpt,
    device: str = DeviceOpt,
    template: str = TemplateOpt,
    store: Path = typer.Option(None, help="cache store directory (default: $TURBORAG_HOME/demo-store)"),
) -> None:
    """Answer bundled questions over bundled passages in full and turbo mode; print answers and TTFT."""
    from turborag.demo import run_demo

    engine = _engine(model, device, store or turborag_home() / "demo-store", template)
    run_demo(engine, stdout())


@app.command("eval")
def eval_cmd(
    data: Path = typer.Argument(..., help="JSONL: {question, answers: [..], contexts: [..]} per line"),
    modes: str = typer.Option(
        "full,turbo,turbo-composite",
        help="comma-separated modes; MODE@MODEL runs a mode on another model (e.g. turbo@runs/ft/model)",
    ),
    limit: int = typer.Option(None, min=1, help="only the first N usable questions"),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    template: str = TemplateOpt,
    store: Path = typer.Option(None, help="cache store (default: $TURBORAG_HOME/eval-store)"),
    max_new_tokens: int = typer.Option(32, min=1),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    predictions: Path = typer.Option(None, help="also write every answer to this JSONL file"),
) -> None:
    """Accuracy and TTFT of every mode on the same questions and passages."""
    from turborag.evaluate import load_examples, run_eval

    mode_list = _parse_modes(modes)
    if not data.is_file():
        fail(f"no such file: {data}")
    examples, problems = load_examples(data, limit)
    for p in problems:
        typer.echo(f"warning: skipped {data}:{p}", err=True)
    if not examples:
        fail(f"{data}: no usable question ({len(problems)} bad lines)")
    preds: list[dict] = []
    results = {}
    for spec, group in _group_by_model(mode_list, model).items():  # one model in memory at a time
        engine = _engine(spec, device, store, template)
        got = run_eval(engine, examples, group, max_new_tokens, progress=not as_json, predictions=preds)
        results.update({(m if spec == model else f"{m}@{spec}"): r for m, r in got.items()})
        del engine
    if predictions:
        predictions.write_text("".join(json.dumps(p) + "\n" for p in preds))
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "modes": {m: vars(r) for m, r in results.items()},
                    "model": model,
                    "skipped_lines": len(problems),
                }
            )
        )
        return
    table = Table(title=f"{data.name}: {len(examples)} questions, model {model}")
    for col in ("mode", "n", "accuracy", "exact match", "TTFT mean (s)", "TTFT p50 (s)"):
        table.add_column(col, justify="right" if col != "mode" else "left")
    for m, r in results.items():
        table.add_row(
            m,
            str(r.n),
            f"{r.accuracy:.1%}",
            f"{r.exact_match:.1%}",
            f"{r.ttft_s_mean:.3f}",
            f"{r.ttft_s_p50:.3f}",
        )
    stdout().print(table)
    stdout().print(
        "TTFT includes loading and assembling chunk caches; precomputing them is offline and excluded."
    )


@bench_app.command("ttft")
def bench_ttft_cmd(
    context_tokens: str = typer.Option("512,2048,8192", help="comma-separated context sizes in tokens"),
    repeats: int = typer.Option(3, min=1, help="measurements per mode and size (median reported)"),
    chunk_tokens: int = typer.Option(512, min=16),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    template: str = TemplateOpt,
    store: Path = typer.Option(None, help="cache store (default: $TURBORAG_HOME/bench-store)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Full vs turbo TTFT per context size, alternating in one run; precompute throughput; bytes/token."""
    from turborag.bench import bench_ttft, rows_as_dicts
    from turborag.model import bytes_per_token

    sizes = int_list(context_tokens, "--context-tokens")
    engine = _engine(model, device, store or turborag_home() / "bench-store", template)
    if max(sizes) + 512 > engine.lm.max_positions:
        fail(f"context of {max(sizes)} tokens does not fit the model's window of {engine.lm.max_positions}")
    rows = bench_ttft(
        engine, sizes, repeats, chunk_tokens, log=lambda r: console.print(r) if not as_json else None
    )
    info = {
        "model": model,
        "device": str(engine.lm.device),
        "dtype": str(engine.lm.dtype).replace("torch.", ""),
        "store_dtype": engine.store.dtype,
        "repeats": repeats,
        "kv_bytes_per_token": bytes_per_token(engine.lm.model, engine.store.torch_dtype),
    }
    if as_json:
        typer.echo(json.dumps({**info, "rows": rows_as_dicts(rows)}))
        return
    table = Table(title=f"TTFT, {model} on {info['device']} ({info['dtype']}), median of {repeats}")
    for col in (
        "context tokens",
        "full TTFT (s)",
        "turbo TTFT (s)",
        "speedup",
        "precompute tok/s",
        "full prefill tok/s",
        "cache bytes/token",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r.context_tokens),
            f"{r.full_ttft_s:.3f}",
            f"{r.turbo_ttft_s:.3f}",
            f"{r.speedup:.1f}x",
            f"{r.precompute_tok_s:.0f}",
            f"{r.full_prefill_tok_s:.0f}",
            f"{r.cache_bytes_per_token:.0f}",
        )
    stdout().print(table)
    stdout().print(
        f"KV bytes per token ({engine.store.dtype}, tensors only): {info['kv_bytes_per_token']}. "
        "Turbo TTFT includes reading caches from the store; precompute is offline."
    )


@bench_app.command("precompute")
def bench_precompute_cmd(
    batch_sizes: str = typer.Option("1,2,4,8", help="comma-separated batch sizes"),
    chunks: int = typer.Option(16, min=1, help="chunks to precompute per measurement"),
    chunk_tokens: int = typer.Option(256, min=16),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    template: str = TemplateOpt,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Precompute throughput per batch size (is batching worth it on this device?)."""
    from turborag.bench import bench_precompute

    sizes = int_list(batch_sizes, "--batch-sizes")
    engine = _engine(model, device, None, template)
    rows = bench_precompute(engine, sizes, chunks, chunk_tokens)
    if as_json:
        typer.echo(json.dumps({"model": model, "device": str(engine.lm.device), "rows": rows}))
        return
    table = Table(
        title=f"precompute throughput, {model} on {engine.lm.device}, {chunks} chunks of ~{chunk_tokens}"
    )
    table.add_column("batch size", justify="right")
    table.add_column("tokens/s", justify="right")
    for r in rows:
        table.add_row(str(r["batch_size"]), f"{r['tok_s']:.0f}")
    stdout().print(table)


@bench_app.command("serve")
def bench_serve_cmd(
    clients: int = typer.Option(32, min=1, max=256, help="concurrent streaming clients (load test)"),
    rounds: int = typer.Option(2, min=1, max=20, help="requests per client"),
    steps: int = typer.Option(10, min=1, max=50, help="agent conversation steps"),
    system_tokens: int = typer.Option(1000, min=16, help="agent system prompt tokens"),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """HTTP server under concurrent streaming load, and prompt caching on an agent-style conversation."""
    from turborag.bench_server import bench_agent, bench_load

    backend = _serve_backend(None, model, device, 8, use_store=False)
    load = bench_load(backend, clients, rounds)
    agent = bench_agent(backend, steps, system_tokens)
    if as_json:
        typer.echo(json.dumps({"model": model, "device": device, "load": load, "agent": agent}))
        return
    t = Table(title=f"load: {clients} concurrent streaming clients x {rounds}, {model} on {device}")
    for col in (
        "requests",
        "errors",
        "requests/s",
        "tokens/s",
        "TTFT p50 (s)",
        "TTFT p99 (s)",
        "queue after",
    ):
        t.add_column(col, justify="right")
    t.add_row(
        str(load["requests"]),
        str(load["errors"]),
        f"{load['requests_per_s']:.2f}",
        f"{load['tokens_per_s']:.1f}",
        f"{load['ttft_p50_s']:.3f}",
        f"{load['ttft_p99_s']:.3f}",
        str(load["queue_depth_after"]),
    )
    stdout().print(t)
    t = Table(
        title=f"agent: {steps} steps, {system_tokens}-token system prompt, TTFT with/without prompt caching"
    )
    for col in ("step", "TTFT reuse (s)", "cached tokens", "TTFT no reuse (s)", "speedup"):
        t.add_column(col, justify="right")
    on = [r for r in agent["rows"] if r["reuse"]]
    off = [r for r in agent["rows"] if not r["reuse"]]
    for a, b in zip(on, off):
        t.add_row(
            str(a["step"]),
            f"{a['ttft_s']:.3f}",
            str(a["cached_tokens"]),
            f"{b['ttft_s']:.3f}",
            f"{b['ttft_s'] / a['ttft_s']:.1f}x",
        )
    stdout().print(t)


@app.command()
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
    device: str = DeviceOpt,
    template: str = TemplateOpt,
) -> None:
    """Cache-aware fine-tune: trains through the serving path (independent chunks, reordered positions)."""
    from turborag.model import load_model
    from turborag.train import TrainConfig
    from turborag.train import finetune as run

    if not data.is_file():
        fail(f"no such file: {data}")
    if positions not in ("reordered", "composite"):
        fail(f"unknown positions {positions!r}: use reordered or composite")
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
    )
    try:
        lm = load_model(model, device)
        dest = run(lm, cfg)
    except (ModelError, ValueError) as e:
        fail(str(e))
    typer.echo(f"fine-tuned model written to {dest} (use it with --model {dest})", err=True)


@app.command()
def serve(
    store: Path = typer.Option(
        None,
        "--store",
        help="store to retrieve from (default: $TURBORAG_HOME/store "
        "if it exists; without one, chat answers without retrieval)",
    ),
    model: str = typer.Option(None, "--model", help="model (default: the store's model, else gemma-3-270m)"),
    host: str = typer.Option("127.0.0.1", help="bind address (localhost unless told otherwise)"),
    port: int = typer.Option(8000, min=1, max=65535),
    api_key: str = typer.Option(None, envvar="TURBORAG_API_KEY", help="require 'Authorization: Bearer KEY'"),
    device: str = DeviceOpt,
    max_queue: int = typer.Option(64, min=1, help="requests waiting for the model before 503"),
    max_tokens: int = typer.Option(64, min=1, help="default max_tokens of a request"),
) -> None:
    """OpenAI-compatible HTTP server: /v1/chat/completions (retrieval + turbo), /v1/completions, documents."""
    import uvicorn

    from turborag.server import create_app

    backend = _serve_backend(store, model, device, max_tokens)
    app = create_app(backend, api_key=api_key, max_queue=max_queue)
    where = f"store {backend.documents.root}" if backend.documents else "no store (no retrieval)"
    console.print(f"serving {backend.model_name} on http://{host}:{port}/v1 with {where}")
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _serve_backend(
    store: Path | None, model: str | None, device: str, max_tokens: int, use_store: bool = True
):
    from turborag.cli_store import default_store, load_engine, open_catalog
    from turborag.server import Backend
    from turborag.server_docs import StoreBackend

    root = store or default_store()
    if not use_store or (store is None and not (root / "catalog.sqlite").exists()):
        engine = _engine(model or DEFAULT_MODEL, device, None, "auto")
        return Backend(engine, engine.lm.name, default_max_tokens=max_tokens)
    catalog = open_catalog(root, create=False)
    engine = load_engine(catalog, model, device, None)  # refuses a model the store was not built with
    catalog.close()
    docs = StoreBackend(root, engine)
    return Backend(
        engine,
        Path(engine.lm.name).name if "/" in engine.lm.name else engine.lm.name,
        retriever=docs,
        documents=docs,
        default_max_tokens=max_tokens,
    )


@data_app.command("synth")
def synth_cmd(
    n: int = typer.Option(100, "--n", min=1, help="number of questions"),
    contexts: int = typer.Option(5, "--contexts", min=1, help="passages per question (one holds the answer)"),
    out: Path = typer.Option(..., "--out", help="output JSONL"),
    seed: int = typer.Option(0),
    domains: str = typer.Option(None, help="comma-separated domains for the questions (default: all)"),
    exclude: str = typer.Option(
        None, help="comma-separated domains to leave out (e.g. held-out eval domains)"
    ),
    max_contexts: int = typer.Option(None, min=1, help="vary passages per question from --contexts to this"),
) -> None:
    """Multi-document QA over fictional facts (only the passages can answer)."""
    import random

    from turborag.synth import DOMAINS, generate, write_jsonl

    doms = [d.strip() for d in domains.split(",")] if domains else list(DOMAINS)
    if exclude:
        doms = [d for d in doms if d not in {x.strip() for x in exclude.split(",")}]
    try:
        if max_contexts is None or max_contexts <= contexts:
            records = generate(n, contexts, seed=seed, domains=doms)
        else:  # varied passage counts: one generator call per question, each with its own seed
            rng = random.Random(seed)
            records = [
                generate(1, rng.randint(contexts, max_contexts), seed=seed * 100_003 + i, domains=doms)[0]
                for i in range(n)
            ]
    except ValueError as e:
        fail(f"{e} (domains: {', '.join(DOMAINS)})")
    write_jsonl(records, out)
    typer.echo(f"wrote {len(records)} questions with {contexts} passages each to {out}", err=True)


from turborag import cli_store  # noqa: E402,F401  (registers ingest, ask, remove, cache, bench ask)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
