"""`turborag bench`: ratios measured side by side in one run (the work is in turborag/bench/)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from turborag.cli.common import (
    DecodeWeightsOpt,
    DeviceOpt,
    DtypeOpt,
    JsonOpt,
    ModelOpt,
    PlotOpt,
    TemplateOpt,
    answer_options,
    check_plot,
    console,
    fail,
    int_list,
    parse_bytes,
    stdout,
    write_plot,
)
from turborag.cli.loading import engine_for, load_engine, open_catalog
from turborag.core.defaults import (
    DECODE_WEIGHTS,
    DEFAULT_MAX_BATCH,
    DEFAULT_MODEL,
    DEFAULT_PREFILL_BUDGET,
    turborag_home,
)
from turborag.core.errors import ModelError
from turborag.core.options import EngineOptions

app = typer.Typer(help="Benchmarks (ratios measured side by side in one run).", no_args_is_help=True)


def _engine_for_sizes(
    sizes: list[int],
    model: str,
    device: str,
    store: Path | None,
    template: str,
    dtype: str,
    ram_cache_bytes: int = 0,
):
    """The engine a context-size benchmark runs on (store default: $TURBORAG_HOME/bench-store), refusing
    sizes that do not fit the model's window with room for the question."""
    options = EngineOptions(ram_cache_bytes=ram_cache_bytes)
    engine = engine_for(
        model, device, store or turborag_home() / "bench-store", template, dtype, options=options
    )
    if max(sizes) + 512 > engine.lm.max_positions:
        fail(f"context of {max(sizes)} tokens does not fit the model's window of {engine.lm.max_positions}")
    return engine


def progress(line: str) -> None:
    """A benchmark's progress line on stderr, as text (never rich markup: it has none)."""
    console.print(line, markup=False, highlight=False)


@app.command("ttft")
def bench_ttft_cmd(
    context_tokens: str = typer.Option("512,2048,8192", help="comma-separated context sizes in tokens"),
    repeats: int = typer.Option(3, min=1, help="full prefills per size (median reported)"),
    samples: int = typer.Option(
        5, min=1, help="turbo and floor measurements per repeat, in pairs (median reported): one request each"
    ),
    chunk_tokens: int = typer.Option(512, min=16),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    template: str = TemplateOpt,
    dtype: str = DtypeOpt,
    store: Path = typer.Option(None, help="cache store (default: $TURBORAG_HOME/bench-store)"),
    ram_cache_bytes: str = typer.Option(
        "0",
        "--ram-cache-bytes",
        help="RAM tier in front of the store, as `serve --ram-cache-bytes` (e.g. 1G; default 0: turbo reads "
        "every cache from the store)",
    ),
    as_json: bool = typer.Option(False, "--json"),
    plot: Path = PlotOpt,
) -> None:
    """Full vs turbo TTFT per context size, alternating in one run; precompute throughput; bytes/token."""
    sizes = int_list(context_tokens, "--context-tokens")
    try:
        ram = parse_bytes(ram_cache_bytes)
    except ValueError as e:
        fail(f"--ram-cache-bytes: {e}")
    check_plot(plot)
    from turborag.bench.engine import bench_ttft, rows_as_dicts  # torch: after the argument checks
    from turborag.bench.plots import plot_ttft
    from turborag.core.arch import bytes_per_token

    engine = _engine_for_sizes(sizes, model, device, store, template, dtype, ram)
    log = (lambda line: None) if as_json else progress
    rows = bench_ttft(engine, sizes, repeats, chunk_tokens, log=log, samples=samples)
    info = {
        "model": model,
        "device": str(engine.lm.device),
        "dtype": str(engine.lm.dtype).replace("torch.", ""),
        "cache_format": engine.store.cache_format,
        "repeats": repeats,
        "samples": samples,
        "ram_cache_bytes": ram,
        "kv_bytes_per_token": bytes_per_token(engine.lm.model, engine.store.torch_dtype),
    }
    result = {**info, "rows": rows_as_dicts(rows)}
    if as_json:
        typer.echo(json.dumps(result))
        write_plot(plot, plot_ttft, result)
        return
    stdout().print(_ttft_table(rows, info))
    stdout().print(
        f"KV bytes per token ({engine.store.cache_format}, tensors only): {info['kv_bytes_per_token']}. "
        f"Turbo TTFT includes reading caches from {'the RAM tier' if ram else 'the store'}; floor = question "
        "prefill + first token against the context already assembled (the abstention reply scored, as turbo "
        "does); precompute is offline."
    )
    write_plot(plot, plot_ttft, result)


def _ttft_table(rows, info: dict) -> Table:
    """`bench ttft`'s rows as a table."""
    table = Table(
        title=f"TTFT, {info['model']} on {info['device']} ({info['dtype']}): full the median of "
        f"{info['repeats']}, turbo and floor of {info['repeats'] * info['samples']}"
    )
    for col in (
        "context tokens",
        "full TTFT (s)",
        "turbo TTFT (s)",
        "floor TTFT (s)",
        "speedup",
        "turbo / floor",
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
            f"{r.floor_ttft_s:.3f}",
            f"{r.speedup:.1f}x",
            f"{r.turbo_ttft_s / r.floor_ttft_s:.2f}x",
            f"{r.precompute_tok_s:.0f}",
            f"{r.full_prefill_tok_s:.0f}",
            f"{r.cache_bytes_per_token:.0f}",
        )
    return table


@app.command("plot")
def bench_plot_cmd(
    json_file: Path = typer.Argument(..., help="a saved --json output (a log whose last line is the JSON)"),
    out: Path = typer.Option(..., "--out", help="the PNG to write"),
) -> None:
    """Draw the plot of a saved `--json` output of `bench ttft`, `bench serve` or `eval`, as --plot would.

    The command is told from the JSON's shape; a file of several lines is read from its last line."""
    check_plot(out)
    from turborag.bench.plots import plot_any

    try:
        lines = json_file.read_text(encoding="utf-8").strip().splitlines()
        result = json.loads(lines[-1]) if lines else None
        if not isinstance(result, dict):
            raise ValueError("no JSON object on its last line")
    except (OSError, ValueError) as e:
        fail(f"{json_file}: {e}")
    try:
        write_plot(out, plot_any, result)
    except (ValueError, KeyError) as e:
        fail(f"{json_file}: {e}")


@app.command("abstain")
def bench_abstain_cmd(
    context_tokens: str = typer.Option("512,2048,8192", help="comma-separated context sizes in tokens"),
    repeats: int = typer.Option(5, min=1, help="measurements per variant and size (median reported)"),
    chunk_tokens: int = typer.Option(512, min=16),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Turbo TTFT with and without scoring the abstention reply (--abstain-threshold), alternating."""
    sizes = int_list(context_tokens, "--context-tokens")
    from turborag.bench.engine import bench_abstain_cost, rows_as_dicts  # torch: after the argument check

    engine = _engine_for_sizes(sizes, model, device, None, "auto", dtype)
    rows = bench_abstain_cost(
        engine, sizes, repeats, chunk_tokens, log=(lambda line: None) if as_json else progress
    )
    info = {
        "model": model,
        "device": str(engine.lm.device),
        "dtype": str(engine.lm.dtype).replace("torch.", ""),
    }
    if as_json:
        typer.echo(json.dumps({**info, "repeats": repeats, "rows": rows_as_dicts(rows)}))
        return
    table = Table(title=f"turbo TTFT with the abstention reply scored, {model}, median of {repeats}")
    for col in ("context tokens", "turbo TTFT (s)", "scored TTFT (s)", "overhead"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r.context_tokens), f"{r.turbo_ttft_s:.3f}", f"{r.scored_ttft_s:.3f}", f"{r.overhead:.2f}x"
        )
    stdout().print(table)


@app.command("store")
def bench_store_cmd(
    formats: str = typer.Option(
        None, help="comma-separated cache formats (default: the 16-bit compute dtype, int8, fp8)"
    ),
    redis: str = typer.Option(None, "--redis", help="also a Redis server: redis://host:port/db"),
    cluster: str = typer.Option(None, "--cluster", help="also a Redis Cluster: redis+cluster://host:port"),
    context_tokens: int = typer.Option(8192, min=64),
    repeats: int = typer.Option(5, min=1, help="measurements per tier and format (median reported)"),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Turbo TTFT at one context size from the RAM tier, local files, Redis and Redis Cluster, per cache
    format, with bytes per token: one run, measured in rotation."""
    from turborag.bench.store import bench_store, rows_as_dicts
    from turborag.store.errors import StoreUnavailable

    engine = engine_for(model, device, None, "auto", dtype)
    fmts = [f.strip() for f in formats.split(",")] if formats else [engine.store.cache_format, "int8", "fp8"]
    root = turborag_home() / "bench-store-tiers"
    try:
        rows = bench_store(
            engine,
            root,
            fmts,
            redis,
            cluster,
            context_tokens,
            repeats,
            log=lambda m: None if as_json else console.print(m),
        )
    except (StoreUnavailable, ValueError) as e:
        fail(str(e))
    info = {
        "model": model,
        "dtype": str(engine.lm.dtype).removeprefix("torch."),
        "context_tokens": context_tokens,
    }
    if as_json:
        typer.echo(json.dumps({**info, "repeats": repeats, "rows": rows_as_dicts(rows)}))
        return
    table = Table(
        title=f"turbo TTFT by tier and format, {context_tokens} context tokens, median of {repeats}"
    )
    for col in ("tier", "format", "TTFT (s)", "bytes/token"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r.tier, r.format, f"{r.ttft_s:.3f}", f"{r.bytes_per_token:,.0f}")
    stdout().print(table)


@app.command("isolation")
def bench_isolation_cmd(
    guesses: int = typer.Option(20, min=2, help="guesses of each kind per store (medians reported)"),
    chunk_tokens: int = typer.Option(256, min=16, help="tokens of each guessed passage"),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Shared against per-collection cache keys (`ingest --isolate-collections`): the bytes two collections
    of the same passages take, and the TTFT of a reader's guess that is another collection's exact text
    against a new text, paired, in one run."""
    from turborag.bench.isolation import bench_isolation, rows_as_dicts

    engine = engine_for(model, device, None, "auto", dtype)
    try:
        rows = bench_isolation(
            engine, guesses, chunk_tokens, turborag_home(), log=lambda m: None if as_json else progress(m)
        )
    except ValueError as e:
        fail(str(e))
    info = {
        "model": model,
        "dtype": str(engine.lm.dtype).removeprefix("torch."),
        "chunk_tokens": chunk_tokens,
    }
    if as_json:
        typer.echo(json.dumps({**info, "guesses": guesses, "rows": rows_as_dicts(rows)}))
        return
    table = Table(
        title=f"a reader's guess of another collection's text, {guesses} pairs, {chunk_tokens} tokens"
    )
    for col in (
        "cache keys",
        "cache MB",
        "same text (s)",
        "new text (s)",
        "new / same",
        "faster: same / new",
        "p",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r.cache_keys,
            f"{r.cache_bytes / 1e6:.1f}",
            f"{r.same_text_ttft_s:.3f}",
            f"{r.new_text_ttft_s:.3f}",
            f"{r.ratio:.2f}x",
            f"{r.same_faster} / {r.new_faster}",
            f"{r.p:.2g}",
        )
    stdout().print(table)


@app.command("precompute")
def bench_precompute_cmd(
    batch_sizes: str = typer.Option("1,2,4,8", help="comma-separated batch sizes"),
    chunks: int = typer.Option(16, min=1, help="chunks to precompute per measurement"),
    chunk_tokens: int = typer.Option(256, min=16),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    template: str = TemplateOpt,
    dtype: str = DtypeOpt,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Precompute throughput per batch size (is batching worth it on this device?)."""
    from turborag.bench.engine import bench_precompute

    sizes = int_list(batch_sizes, "--batch-sizes")
    engine = engine_for(model, device, None, template, dtype)
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


@app.command("decode")
def bench_decode_cmd(
    sequences: str = typer.Option("1,8,32", help="comma-separated numbers of concurrent sequences"),
    steps: int = typer.Option(32, min=2, help="decode steps timed per run (one token per sequence each)"),
    context_tokens: int = typer.Option(512, min=16, help="passage tokens every sequence answers from"),
    weights: str = typer.Option(
        "float,int8", help="comma-separated weights decode steps read, measured in turn: float, int8, int4"
    ),
    llama_cpp: str = typer.Option(
        None,
        "--llama-cpp",
        help="also decode one sequence with llama.cpp (llama-cpp-python) on this GGUF and the same prompt "
        "and threads; `auto`: the GGUF the model was converted from",
        show_default=False,
    ),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    template: str = TemplateOpt,
    dtype: str = DtypeOpt,
    store: Path = typer.Option(None, help="cache store (default: $TURBORAG_HOME/bench-store)"),
    as_json: bool = JsonOpt,
) -> None:
    """Decode tokens/s after the first token at 1, 8 and 32 sequences; bytes read per step; the bound that
    the machine's memory bandwidth sets; llama.cpp's tokens/s beside them."""
    counts = int_list(sequences, "--sequences")
    kinds = [w.strip() for w in weights.split(",") if w.strip()]
    if not kinds or set(kinds) - set(DECODE_WEIGHTS) or kinds != sorted(set(kinds), key=kinds.index):
        fail(f"--weights {weights}: a list of float, int8 and int4, each once")
    import torch  # after the argument checks

    from turborag.bench import decode
    from turborag.core import decode_weights
    from turborag.core.engine import Engine

    engine = _engine_for_sizes([context_tokens], model, device, store, template, dtype)
    gguf = _source_gguf(engine.lm, llama_cpp) if llama_cpp else None
    log = (lambda line: None) if as_json else progress
    bandwidth = decode.memory_bandwidth()
    rows = []
    for kind in sorted(kinds, key=DECODE_WEIGHTS.index):  # float first: the model's own
        if kind != "float":
            decode_weights.drop_decode_weights(engine.lm.model)  # the previous kind's copies
            options = dataclasses.replace(engine.options, decode_weights=kind)
            try:
                engine = Engine(engine.lm, engine.store, options)
            except ModelError as e:  # off the CPU
                fail(str(e))
        rows += decode.bench_decode(engine, counts, steps, context_tokens, log=log)
    threads = torch.get_num_threads()
    out = {
        "model": model,
        "dtype": str(engine.lm.dtype).replace("torch.", ""),
        "threads": threads,
        "context_tokens": context_tokens,
        "bandwidth_bytes_per_s": bandwidth.bytes_per_s,
        "rows": [vars(r) | {"bound_tokens_per_s": _bound(r, bandwidth.bytes_per_s)} for r in rows],
        "llama_cpp": None,
    }
    if gguf is not None:
        prompt = engine.check_fits(
            decode.QUESTION, decode.doc_chunks(engine, context_tokens), engine.qa_params()
        )
        try:
            seconds = decode.llama_cpp_decode(str(gguf), prompt.ids, steps, threads)
        except decode.LlamaCppUnavailable as e:
            fail(str(e))
        out["llama_cpp"] = {
            "gguf": str(gguf),
            "gguf_bytes": gguf.stat().st_size,
            "tokens_per_s": steps / seconds,
        }
    if as_json:
        typer.echo(json.dumps(out))
        return
    stdout().print(_decode_table(out))


def _bound(row, bandwidth: float) -> float:
    """Tokens/s that memory bandwidth allows a step reading the row's bytes."""
    return row.sequences * bandwidth / (row.weight_bytes + row.kv_bytes)


def _source_gguf(lm, given: str) -> Path:
    """The GGUF llama.cpp reads: the path given, or with `auto` the one the model was converted from."""
    if given != "auto":
        path = Path(given).expanduser()
        if not (path.is_file() and path.suffix == ".gguf"):
            fail(f"--llama-cpp {given}: not a .gguf file")
        return path
    source = (lm.folder or Path()) / "turborag_source.json"
    if not source.is_file():
        fail(f"--llama-cpp auto: {lm.name} was not converted from a GGUF; pass the GGUF's path")
    return Path(json.loads(source.read_text())["gguf"])


def _decode_table(out: dict) -> Table:
    table = Table(
        title=f"Decode after the first token: {out['model']}, {out['dtype']}, {out['threads']} threads, "
        f"{out['context_tokens']} context tokens; memory bandwidth "
        f"{out['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s"
    )
    columns = ("engine", "weights", "sequences", "tokens/s", "MB read per step", "bound tokens/s", "of bound")
    for col in columns:
        table.add_column(col, justify="left" if col in ("engine", "weights") else "right")
    for r in out["rows"]:
        read = (r["weight_bytes"] + r["kv_bytes"]) / 1e6
        share = r["tokens_per_s"] / r["bound_tokens_per_s"]
        table.add_row(
            "turborag",
            r["weights"],
            str(r["sequences"]),
            f"{r['tokens_per_s']:.2f}",
            f"{read:,.0f}",
            f"{r['bound_tokens_per_s']:.2f}",
            f"{share:.0%}",
        )
    if out["llama_cpp"]:
        ll = out["llama_cpp"]
        file_mb = f"{ll['gguf_bytes'] / 1e6:,.0f} (file)"
        table.add_row("llama.cpp", "GGUF", "1", f"{ll['tokens_per_s']:.2f}", file_mb, "", "")
    return table


@app.command("serve")
def bench_serve_cmd(
    clients: int = typer.Option(32, min=1, max=256, help="concurrent streaming clients (load test)"),
    rounds: int = typer.Option(2, min=1, max=20, help="requests per client"),
    max_tokens: int = typer.Option(64, min=1, max=4096, help="max_tokens of each load request"),
    min_tokens: int = typer.Option(
        0,
        min=0,
        max=4096,
        help="min_tokens of each load request: answers of a fixed length (set it to --max-tokens), as "
        "serving benchmarks do to measure decoding; 0 = the model's own answer lengths",
    ),
    max_batch: int = typer.Option(
        DEFAULT_MAX_BATCH, min=2, help="continuous batching width, measured against --max-batch 1"
    ),
    max_batch_tokens: int = typer.Option(
        DEFAULT_PREFILL_BUDGET,
        "--max-batch-tokens",
        min=1,
        help="the batched server's prefill tokens per iteration (serve --max-batch-tokens)",
    ),
    full_share: float = typer.Option(
        0.25,
        min=0.0,
        max=1.0,
        help="also a mixed load: this share of the requests in `full` mode (a prefill of every passage), "
        "TTFT of turbo and full requests reported apart; 0 = turbo only",
    ),
    sweep: str = typer.Option(
        "1,4,16,32",
        help="also TTFT against concurrency: turbo-only loads of these numbers of clients, at --max-batch 1 "
        "and batched (the --clients load is reused); '' = none",
    ),
    steps: int = typer.Option(10, min=1, max=50, help="agent conversation steps"),
    system_tokens: int = typer.Option(1000, min=16, help="agent system prompt tokens"),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    decode_weights: str = DecodeWeightsOpt,
    as_json: bool = typer.Option(False, "--json"),
    plot: Path = PlotOpt,
) -> None:
    """HTTP server under concurrent streaming load, one request at a time vs continuous batching (one run),
    turbo only and mixed with full requests, TTFT against the number of clients, and prompt caching on an
    agent-style conversation."""
    from turborag.bench.plots import plot_serve
    from turborag.bench.serve import bench_agent, bench_load, sweep_row
    from turborag.cli.serve import served_for

    check_plot(plot)
    if min_tokens > max_tokens:
        fail(f"--min-tokens {min_tokens} is more than --max-tokens {max_tokens}")
    counts = int_list(sweep, "--sweep") if sweep.strip() else []
    if counts and max(counts) > 256:
        fail(f"--sweep counts clients, at most 256, got {max(counts)}")
    options = answer_options(None, None, decode_weights)  # a bad kind is refused before the model loads
    served = served_for(None, model, device, 8, use_store=False, dtype=dtype, options=options)

    def measure(n: int, width: int, share: float = 0.0) -> dict:
        return bench_load(
            served,
            n,
            rounds,
            max_tokens,
            max_batch=width,
            min_tokens=min_tokens,
            full_share=share,
            max_batch_tokens=max_batch_tokens,
        )

    alone, load = measure(clients, 1), measure(clients, max_batch)
    runs = {(clients, 1): alone, (clients, max_batch): load}
    for n in sorted(set(counts)):
        for width in (1, max_batch):
            if (n, width) not in runs:
                runs[n, width] = measure(n, width)
    mixed = {width: measure(clients, width, full_share) for width in (1, max_batch)} if full_share else {}
    agent = bench_agent(served, steps, system_tokens)
    ratios = _serve_ratios(alone, load, mixed.get(max_batch))
    out = {"model": model, "device": device, "decode_weights": decode_weights, "load": load}
    out |= {"load_max_batch_1": alone, "ratios": ratios}
    if mixed:
        out["mixed"], out["mixed_max_batch_1"] = mixed[max_batch], mixed[1]
    if counts:
        out["sweep"] = [sweep_row(runs[n, w]) for n in sorted(set(counts)) for w in (1, max_batch)]
    out["agent"] = agent  # last
    if as_json:
        typer.echo(json.dumps(out))
        write_plot(plot, plot_serve, out)
        return
    _print_load(out, clients, rounds, min_tokens, max_tokens, max_batch, max_batch_tokens)
    if counts:
        _print_sweep(out["sweep"], rounds)
    _print_agent(agent, steps, system_tokens)
    write_plot(plot, plot_serve, out)


def _serve_ratios(alone: dict, load: dict, mixed: dict | None) -> dict[str, float | None]:
    """Batched against one at a time (requests/s, tokens/s, TTFT p99), and what the mixed load's long
    prefills do to the turbo requests' tail, batched."""
    ratios = {
        name: (load[key] / alone[key] if alone[key] else None)
        for name, key in (
            ("requests_per_s", "requests_per_s"),
            ("tokens_per_s", "tokens_per_s"),
            ("ttft_p99", "ttft_p99_s"),
        )
    }
    if mixed:
        turbo_p99 = load["turbo_ttft_p99_s"]
        ratios["mixed_turbo_ttft_p99_vs_turbo_only"] = (
            mixed["turbo_ttft_p99_s"] / turbo_p99 if turbo_p99 else None
        )
    return ratios


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _print_load(out: dict, clients: int, rounds: int, min_tokens: int, max_tokens: int, max_batch: int,
                max_batch_tokens: int) -> None:  # fmt: skip
    """The load runs of `bench serve` (one at a time and batched, turbo only and mixed) and their ratios."""
    model, device, ratios = out["model"], out["device"], out["ratios"]
    alone, load = out["load_max_batch_1"], out["load"]
    mixed = {1: out["mixed_max_batch_1"], max_batch: out["mixed"]} if "mixed" in out else {}
    length = (
        f"answers of {min_tokens}-{max_tokens} tokens" if min_tokens else f"answers up to {max_tokens} tokens"
    )
    t = Table(
        title=f"load: {clients} concurrent streaming clients x {rounds}, {length}, {model} on {device}, "
        f"at most {max_batch_tokens} prefill tokens an iteration"
    )
    columns = ["load", "max batch", "requests", "errors", "requests/s", "tokens/s", "TTFT p50 (s)"]
    columns += ["TTFT p99 (s)", "turbo / full TTFT p99 (s)", "ITL p50 (s)", "ITL p99 (s)"]
    for col in [*columns, "longest iteration (s, tokens)", "queue after"]:
        t.add_column(col, justify="right")

    for row in (alone, load, *([mixed[1], mixed[max_batch]] if mixed else [])):
        t.add_row(
            f"{row['full_share']:.0%} full" if row["full_share"] else "turbo",
            str(row["max_batch"]),
            str(row["requests"]),
            str(row["errors"]),
            f"{row['requests_per_s']:.2f}",
            f"{row['tokens_per_s']:.1f}",
            f"{row['ttft_p50_s']:.3f}",
            f"{row['ttft_p99_s']:.3f}",
            f"{_seconds(row['turbo_ttft_p99_s'])} / {_seconds(row['full_ttft_p99_s'])}",
            f"{row['itl_p50_s'] or 0:.3f}",
            f"{row['itl_p99_s'] or 0:.3f}",
            f"{row['longest_iteration_s']:.2f}, {row['longest_prefill_tokens']}",
            str(row["queue_depth_after"]),
        )
    stdout().print(t)
    shown = {k: "-" if v is None else f"{v:.2f}x" for k, v in ratios.items()}
    stdout().print(
        f"batching vs one at a time: {shown['requests_per_s']} requests/s, "
        f"{shown['tokens_per_s']} tokens/s, TTFT p99 {shown['ttft_p99']}"
        + (
            f"; mixed load: turbo TTFT p99 {shown['mixed_turbo_ttft_p99_vs_turbo_only']} of turbo-only"
            if mixed
            else ""
        )
    )


def _print_sweep(rows: list[dict], rounds: int) -> None:
    """TTFT against the number of clients, turbo only."""
    t = Table(title=f"TTFT against concurrency: turbo only, {rounds} requests a client")
    for col in ("clients", "max batch", "requests/s", "TTFT p50 (s)", "TTFT p99 (s)", "errors"):
        t.add_column(col, justify="right")
    for row in rows:
        t.add_row(
            str(row["clients"]),
            str(row["max_batch"]),
            f"{row['requests_per_s']:.2f}",
            _seconds(row["ttft_p50_s"]),
            _seconds(row["ttft_p99_s"]),
            str(row["errors"]),
        )
    stdout().print(t)


def _print_agent(agent: dict, steps: int, system_tokens: int) -> None:
    """The agent conversation's TTFT with and without prompt caching, step by step."""
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


@app.command("ask")
def bench_ask_cmd(
    corpus: Path = typer.Option(
        None, help="documents to ingest (default: CPython's docs as --docs .md files)"
    ),
    docs: int = typer.Option(60, min=1, help="documents of the default corpus"),
    top_k: str = typer.Option("5,16", "--top-k", help="comma-separated top-k values"),
    questions: int = typer.Option(8, min=1, help="questions per top-k (from a fixed list)"),
    repeats: int = typer.Option(1, min=1, help="full/turbo measurements per question (alternating)"),
    store: Path = typer.Option(None, help="store (default: a fresh $TURBORAG_HOME/bench-ask-store)"),
    model: str = typer.Option(DEFAULT_MODEL, "--model"),
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Ingest throughput, then `ask` TTFT full vs turbo per top-k, measured side by side in one run."""
    from turborag.bench.ask import bench_ask, write_corpus

    ks = sorted(set(int_list(top_k, "--top-k")))
    if corpus is not None and not corpus.exists():
        fail(f"no such file or folder: {corpus}")
    root = store or turborag_home() / "bench-ask-store"
    if store is None and root.exists():
        import shutil

        shutil.rmtree(root)  # our own scratch store: fresh caches so ingest throughput is real
    catalog = open_catalog(root, create=True)
    engine = load_engine(
        catalog, model, device, None, ingest=True, dtype=dtype, chunk_tokens=256, chunk_overlap=32
    )
    if corpus is None:
        corpus = write_corpus(turborag_home() / "bench-ask-corpus", docs)
    log = None if as_json else lambda msg: console.print(msg)
    result = bench_ask(engine, catalog, corpus, ks, questions, repeats, log=log)
    if as_json:
        typer.echo(json.dumps(result))
        return
    ing = result["ingest"]
    Console().print(
        f"ingest: {ing['documents']} documents, {ing['chunks']} chunks, {ing['tokens']} tokens in "
        f"{ing['seconds']:.1f} s = {ing['tokens_per_s']:.0f} tokens/s, {ing['chunks_per_s']:.2f} chunks/s "
        f"(caches {ing['cache_bytes'] / 1e6:.1f} MB)"
    )
    table = Table(
        title=f"ask TTFT, {model} on {result['device']}, median over {questions} questions x {repeats}"
    )
    for col in ("top-k", "context tokens", "full TTFT (s)", "turbo TTFT (s)", "speedup", "retrieval (ms)"):
        table.add_column(col, justify="right")
    for r in result["rows"]:
        table.add_row(
            str(r["top_k"]),
            f"{r['context_tokens_mean']:.0f}",
            f"{r['full_ttft_s']:.3f}",
            f"{r['turbo_ttft_s']:.3f}",
            f"{r['speedup']:.1f}x",
            f"{r['retrieval_ms']:.0f}",
        )
    Console().print(table)


@app.command("cold-ask")
def bench_cold_ask_cmd(
    store: Path = typer.Option(None, help="store to ask (default: the demo's, $TURBORAG_HOME/demo-store)"),
    repeats: int = typer.Option(3, min=1, max=20, help="asks of each kind (median reported)"),
    as_json: bool = JsonOpt,
) -> None:
    """Wall clock of `turborag ask` in a new process: cold (loads the model) and through a running server."""
    from turborag.bench.startup import bench_cold_ask

    root = store or turborag_home() / "demo-store"
    if not (root / "catalog.sqlite").is_file():
        fail(f"no store at {root}: run `turborag demo` first (or pass --store)")
    try:
        r = bench_cold_ask(root, repeats, log=(lambda m: None) if as_json else console.print)
    except RuntimeError as e:
        fail(str(e), code=1)
    if as_json:
        typer.echo(json.dumps(r))
        return
    table = Table(title=f"`turborag ask` wall clock on {root}, median of {repeats}")
    for col in ("", "wall clock (s)", "TTFT (s)", "wall - TTFT (s)"):
        table.add_column(col, justify="right")
    table.add_row(
        "cold (new process, loads the model)",
        f"{r['cold_wall_s']:.2f}",
        f"{r['cold_ttft_s']:.3f}",
        f"{r['cold_wall_s'] - r['cold_ttft_s']:.2f}",
    )
    table.add_row(
        "through a running server",
        f"{r['server_wall_s']:.2f}",
        f"{r['server_ttft_s']:.3f}",
        f"{r['server_overhead_s']:.2f}",
    )
    stdout().print(table)


@app.command("ingest")
def bench_ingest_cmd(
    workers: str = typer.Option("1,2", "--workers", help="comma-separated Ray worker counts"),
    ray: str = typer.Option("local", "--ray", help="local (start Ray here), auto, or the cluster's ADDRESS"),
    docs: int = typer.Option(20, min=1, help="documents of the corpus (CPython's docs as .md files)"),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Ingest throughput (tokens/s) with `ingest --ray` at each worker count, each into a fresh store, and a
    local ingest of the same corpus, in one run."""
    import shutil

    from turborag.bench.ask import write_corpus
    from turborag.cli.documents import _ray_remote
    from turborag.rag.chunker import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, Chunker
    from turborag.rag.embed import Embedder
    from turborag.rag.ingest import Ingestor
    from turborag.rag.ray_precompute import connect

    counts = sorted(set(int_list(workers, "--workers")))
    if min(counts) < 1:
        fail("--workers: counts must be at least 1")
    corpus = write_corpus(turborag_home() / "bench-ingest-corpus", docs)
    embedder = Embedder()
    rows = []
    for n in [0, *counts]:  # 0 = a local ingest, no Ray
        root = turborag_home() / f"bench-ingest-store-{n}"
        shutil.rmtree(root, ignore_errors=True)
        catalog = open_catalog(root, create=True)
        engine = load_engine(
            catalog, model, device, None, ingest=True, dtype=dtype,
            chunk_tokens=DEFAULT_CHUNK_TOKENS, chunk_overlap=DEFAULT_OVERLAP,
        )  # fmt: skip
        remote = None
        if n:
            connect(ray, max(counts))  # one Ray instance for every count: as many CPUs as the most workers
            remote = _ray_remote(engine, catalog, ray, n)
        chunker = Chunker(engine.lm.tokenizer, DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP)
        res = Ingestor(engine, catalog, embedder, chunker, remote=remote).run([corpus])
        rows.append(
            {
                "workers": n or "local",
                "chunks": res.chunks,
                "tokens": res.tokens,
                "seconds": res.seconds,
                "tokens_per_s": res.tokens / res.seconds if res.seconds else 0.0,
            }
        )
        del engine
    if as_json:
        typer.echo(json.dumps({"model": model, "docs": docs, "rows": rows}))
        return
    table = Table(title=f"ingest of {docs} documents: local vs Ray workers ({model})")
    for col in ("workers", "chunks", "tokens", "seconds", "tokens/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["workers"]),
            str(r["chunks"]),
            str(r["tokens"]),
            f"{r['seconds']:.1f}",
            f"{r['tokens_per_s']:.0f}",
        )
    stdout().print(table)
    stdout().print(
        "Each row is a fresh store; Ray rows include starting the actors and loading a model in each."
    )
