"""The store commands of the `turborag` CLI: ingest, ask, remove, cache stats|verify|gc, bench ask.

Registered on `turborag.cli.app` by the import at the bottom of cli.py. Every command is a thin shell:
argument checks that need no model come first (a bad path fails at once with one line and exit 2), then
the store is opened and validated, then the model is loaded and checked against the store.

`--store` defaults to `$TURBORAG_HOME/store` (`~/.cache/turborag/store`). The store remembers its model,
template, cache dtype and chunking, so `ask` needs no `--model`, and a different model is refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from turborag.catalog import Catalog, StoreError
from turborag.cli import DeviceOpt, app, bench_app, console, fail, int_list
from turborag.engine import MODES
from turborag.model import DEFAULT_MODEL, ModelError, turborag_home

cache_app = typer.Typer(help="The store's KV caches: stats, verify, gc.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")

StoreOpt = typer.Option(None, "--store", help="store directory (default: $TURBORAG_HOME/store)")
StoreModelOpt = typer.Option(
    None, "--model", help="gemma-3-270m, an HF model folder or a .gguf file (default: the store's model)"
)
StoreTemplateOpt = typer.Option(None, "--template", help="auto, plain or chat (default: the store's)")
JsonOpt = typer.Option(False, "--json", help="print one JSON object")


def default_store() -> Path:
    return turborag_home() / "store"


def open_catalog(store: Path | None, create: bool) -> Catalog:
    try:
        return Catalog(store or default_store(), create=create)
    except StoreError as e:
        fail(str(e))


def _model_spec(spec: str) -> str:
    """Paths are remembered absolute, so the store works from any working directory."""
    if spec == DEFAULT_MODEL:
        return spec
    p = Path(spec).expanduser()
    return str(p.resolve()) if p.exists() else spec


def load_engine(
    catalog: Catalog, model: str | None, device: str, template: str | None, ingest: bool = False, **settings
):
    """The engine for this store; with `ingest`, binds a new store to the model (and settings)."""
    import transformers

    from turborag.embed import EMBEDDER
    from turborag.engine import Engine
    from turborag.model import load_model
    from turborag.store import KVStore

    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars; ingest draws its own
    meta = catalog.meta()
    if not ingest and "model_fingerprint" not in meta:
        fail(f"store {catalog.root} is empty: run `turborag ingest PATH --store {catalog.root}` first")
    spec = _model_spec(model or meta.get("model") or DEFAULT_MODEL)
    try:
        with console.status(f"loading {spec}"):
            lm = load_model(spec, device)
        engine = Engine(
            lm,
            KVStore(catalog.root, meta.get("store_dtype", "float16")),
            template or meta.get("template") or "auto",
        )
        bound = dict(
            template=engine.layout.template, store_dtype=engine.store.dtype, embedder=EMBEDDER, **settings
        )
        if ingest:
            catalog.bind(spec, lm.fingerprint, **bound)
        else:
            catalog.check(spec, lm.fingerprint, **bound)
        return engine
    except (ModelError, StoreError, ValueError) as e:
        fail(str(e))


class RichProgress:
    """Ingest progress on stderr: bar, chunks done/total, tokens/s, ETA."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None

    def start(self, chunks: int, tokens: int) -> None:
        if not self.enabled or not chunks:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("computing caches"),
            BarColumn(),
            TextColumn("{task.fields[chunks]}/{task.fields[total_chunks]} chunks"),
            TextColumn("{task.fields[tps]} tokens/s"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self.task = self.bar.add_task("ingest", total=tokens, chunks=0, total_chunks=chunks, tps="-")
        self.done = 0
        self.bar.start()

    def advance(self, chunks: int, tokens: int) -> None:
        if self.bar is None:
            return
        self.done += chunks
        self.bar.advance(self.task, tokens)
        speed = self.bar.tasks[0].speed
        self.bar.update(self.task, chunks=self.done, tps=f"{speed:.0f}" if speed else "-")

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


# ---------------------------------------------------------------------------------------------------------
# ingest / remove


@app.command()
def ingest(
    paths: list[Path] = typer.Argument(
        ..., help="files or folders (.txt .md .html .pdf .jsonl; folders recursively)"
    ),
    store: Path = StoreOpt,
    model: str = StoreModelOpt,
    device: str = DeviceOpt,
    template: str = StoreTemplateOpt,
    chunk_tokens: int = typer.Option(
        None, min=8, help="chunk size in model tokens (default 256, or the store's)"
    ),
    overlap: int = typer.Option(
        None, min=0, help="chunk overlap in model tokens (default 32, or the store's)"
    ),
    prune: bool = typer.Option(False, "--prune", help="also drop documents whose files are gone"),
    as_json: bool = JsonOpt,
) -> None:
    """Add files to the store: chunk, precompute KV caches, embed. Unchanged files cost nothing; a killed run
    resumes where it stopped."""
    from turborag.chunker import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, Chunker, check_params
    from turborag.embed import Embedder
    from turborag.ingest import Ingestor, StoreWriteError

    for p in paths:
        if not p.expanduser().exists():
            fail(f"no such file or folder: {p}")
    catalog = open_catalog(store, create=True)
    meta = catalog.meta()
    size = chunk_tokens or int(meta.get("chunk_tokens", DEFAULT_CHUNK_TOKENS))
    ovl = overlap if overlap is not None else int(meta.get("chunk_overlap", min(DEFAULT_OVERLAP, size // 2)))
    try:
        check_params(size, ovl)
    except ValueError as e:
        fail(str(e))
    engine = load_engine(catalog, model, device, template, ingest=True, chunk_tokens=size, chunk_overlap=ovl)
    chunker = Chunker(engine.lm.tokenizer, size, ovl)
    ingestor = Ingestor(engine, catalog, Embedder(), chunker, progress=RichProgress(enabled=not as_json))
    try:
        res = ingestor.run(paths, prune=prune)
    except StoreWriteError as e:
        fail(str(e), code=1)
    except (FileNotFoundError, StoreError) as e:
        fail(str(e))
    for path, reason in res.skipped:
        typer.echo(f"skipped {path}: {reason}", err=True)
    for w in res.warnings:
        typer.echo(f"warning: {w}", err=True)
    if as_json:
        typer.echo(json.dumps(res.summary()))
        return
    tps = f" ({res.tokens / res.seconds:.0f} tokens/s)" if res.tokens and res.seconds else ""
    typer.echo(
        f"{res.documents} documents ({res.unchanged_documents} unchanged), {res.chunks} chunks: "
        f"{res.new_chunks} new, {res.removed_chunks} removed"
        + (f", {res.pruned_documents} documents pruned" if res.pruned_documents else "")
        + f". Computed {res.computed_chunks} caches, {res.tokens} tokens in {res.seconds:.1f} s{tps}, "
        f"{res.cache_bytes / 1e6:.1f} MB written"
        + (f" ({res.repaired_caches} missing caches recomputed)" if res.repaired_caches else "")
        + f". Store: {catalog.root}"
    )


@app.command()
def remove(
    paths: list[Path] = typer.Argument(
        ..., help="files or folders whose documents to drop (they may be gone)"
    ),
    store: Path = StoreOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Drop documents (and their caches) from the store."""
    from turborag.ingest import StoreWriteError, remove
    from turborag.store import KVStore

    catalog = open_catalog(store, create=False)
    try:
        docs, chunks = remove(
            catalog, KVStore(catalog.root, catalog.meta().get("store_dtype", "float16")), paths
        )
    except StoreError as e:
        fail(str(e))
    except OSError as e:
        fail(str(StoreWriteError(f"could not write the store at {catalog.root}: {e}")), code=1)
    if as_json:
        typer.echo(json.dumps({"documents": docs, "chunks": chunks}))
    elif docs:
        typer.echo(f"removed {docs} documents ({chunks} chunks) from {catalog.root}")
    if not docs:
        fail(f"nothing in {catalog.root} comes from {', '.join(map(str, paths))}", code=1)


# ---------------------------------------------------------------------------------------------------------
# ask


@app.command()
def ask(
    question: str = typer.Argument(..., help="the question"),
    store: Path = StoreOpt,
    mode: str = typer.Option("turbo", help=f"one of {', '.join(MODES)}"),
    top_k: int = typer.Option(5, "--top-k", min=1, help="passages to retrieve"),
    max_new_tokens: int = typer.Option(64, min=1),
    model: str = StoreModelOpt,
    device: str = DeviceOpt,
    template: str = StoreTemplateOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Answer from the store: retrieve top-k chunks, reuse their caches (turbo) or prefill them (full)."""
    from turborag.ask import Retriever, fit_passages
    from turborag.embed import Embedder
    from turborag.engine import Answer, PromptTooLong
    from turborag.generate import SamplingParams

    if mode not in MODES:
        fail(f"unknown mode {mode}: use one of {', '.join(MODES)}")
    if not question.strip():
        fail("the question is empty")
    catalog = open_catalog(store, create=False)
    engine = load_engine(catalog, model, device, template)
    retriever = Retriever(catalog, Embedder())
    if not len(retriever):
        fail(f"store {catalog.root} has no chunks: ingest some documents first")
    passages = retriever.search(question, top_k)
    try:
        passages, dropped = fit_passages(engine, question, passages, max_new_tokens)
    except PromptTooLong as e:
        fail(str(e))
    if dropped:
        typer.echo(
            f"warning: {dropped} of the top {top_k} passages do not fit the context window; "
            "answering from the rest",
            err=True,
        )
    # Base models run on after their answer ("Question: ..."): stop at the line end; chat models stop at EOS.
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_at_newline=engine.layout.template == "plain")
    answer = None
    for item in engine.stream(question, [p.text for p in passages], mode, params):
        if isinstance(item, Answer):
            answer = item
        elif not as_json:
            sys.stdout.write(item)
            sys.stdout.flush()
    if answer.computed_chunks:
        typer.echo(
            f"warning: {answer.computed_chunks} chunk caches were missing or damaged and were "
            "recomputed for this answer (`turborag cache verify` checks them all)",
            err=True,
        )
    ids = [p.chunk_id for p in passages]
    if as_json:
        out = {
            "answer": answer.text,
            "mode": mode,
            "ttft_s": round(answer.ttft_s, 4),
            "total_s": round(answer.total_s, 4),
            "prompt_tokens": answer.prompt_tokens,
            "cached_tokens": answer.cached_tokens,
            "chunks": ids,
        }
        typer.echo(json.dumps(out))
        return
    typer.echo("")
    typer.echo(
        f"[{mode}] TTFT {answer.ttft_s * 1000:.0f} ms, total {answer.total_s:.2f} s, "
        f"{answer.prompt_tokens} prompt tokens ({answer.cached_tokens} from caches); passages: "
        + ", ".join(_short(i) for i in ids),
        err=True,
    )


def _short(chunk_id: str) -> str:
    """`/long/path/to/file.md#3:abcdef012345` -> `file.md#3`."""
    name = chunk_id.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[0]


# ---------------------------------------------------------------------------------------------------------
# cache stats | verify | gc


def _kv(catalog: Catalog):
    from turborag.store import KVStore

    return KVStore(catalog.root, catalog.meta().get("store_dtype", "float16"))


def _cache_files(root: Path) -> list[Path]:
    kv = root / "kv"
    return sorted(kv.glob("*/*.safetensors")) if kv.is_dir() else []


@cache_app.command("stats")
def cache_stats(store: Path = StoreOpt, as_json: bool = JsonOpt) -> None:
    """Documents, chunks, tokens and cache bytes in the store."""
    catalog = open_catalog(store, create=False)
    meta = catalog.meta()
    stats = catalog.stats()
    files = _cache_files(catalog.root)
    known = {k for k, _ in catalog.cache_entries()}
    stats.update(
        store=str(catalog.root),
        model=meta.get("model"),
        model_fingerprint=meta.get("model_fingerprint"),
        chunk_tokens=int(meta["chunk_tokens"]) if "chunk_tokens" in meta else None,
        chunk_overlap=int(meta["chunk_overlap"]) if "chunk_overlap" in meta else None,
        store_dtype=meta.get("store_dtype"),
        disk_bytes=sum(f.stat().st_size for f in files),
        orphan_files=sum(1 for f in files if f.stem not in known),
    )
    if as_json:
        typer.echo(json.dumps(stats))
        return
    table = Table(title=f"store {catalog.root}", show_header=False)
    for k, v in stats.items():
        if k != "store":
            table.add_row(k.replace("_", " "), f"{v:,}" if isinstance(v, int) else str(v))
    Console().print(table)


@cache_app.command("verify")
def cache_verify(store: Path = StoreOpt, as_json: bool = JsonOpt) -> None:
    """Read every cache file and check its checksum. Damaged files are removed (never used); exit 1 if any
    cache is missing or damaged. `turborag ingest` on the same paths recomputes them (so does `ask`)."""
    catalog = open_catalog(store, create=False)
    kv = _kv(catalog)
    ok, missing, damaged = 0, [], []
    for key, _ in catalog.cache_entries():
        exists = key in kv
        if kv.get(key) is not None:
            ok += 1
        elif exists:
            damaged.append(key)
        else:
            missing.append(key)
    out = {"ok": ok, "missing": len(missing), "damaged": len(damaged)}
    if as_json:
        typer.echo(json.dumps(out))
    else:
        typer.echo(f"{ok} caches ok, {len(missing)} missing, {len(damaged)} damaged (removed)", err=True)
    if missing or damaged:
        fail(
            f"{len(missing) + len(damaged)} caches need recomputing: run `turborag ingest` on the same paths "
            f"with --store {catalog.root} (or let `ask` recompute them when needed)",
            code=1,
        )


@cache_app.command("gc")
def cache_gc(store: Path = StoreOpt, as_json: bool = JsonOpt) -> None:
    """Delete caches no chunk uses (left by changed, removed or killed ingests) and stale temp files."""
    from turborag.ingest import INDEX_FILE, free_caches

    catalog = open_catalog(store, create=False)
    kv = _kv(catalog)
    files = freed = 0
    try:
        with catalog.write_lock():  # no ingest is running: every file the catalog does not name is garbage
            freed += free_caches(catalog, kv)
            known = {k for k, _ in catalog.cache_entries()}
            kv_dir = catalog.root / "kv"
            garbage = [f for f in _cache_files(catalog.root) if f.stem not in known]
            if kv_dir.is_dir():
                garbage += list(kv_dir.glob("*/.tmp-*"))
            garbage += list(catalog.root.glob(f".tmp-*{INDEX_FILE}"))
            for f in garbage:
                freed += f.stat().st_size
                f.unlink()
                files += 1
            catalog.db.execute("VACUUM")
    except StoreError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps({"files_removed": files, "bytes_freed": freed}))
    else:
        typer.echo(f"removed {files} unused files, {freed / 1e6:.1f} MB freed", err=True)


# ---------------------------------------------------------------------------------------------------------
# bench ask


@bench_app.command("ask")
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
    as_json: bool = JsonOpt,
) -> None:
    """Ingest throughput, then `ask` TTFT full vs turbo per top-k, measured side by side in one run."""
    from turborag.bench_rag import bench_ask, write_corpus

    ks = sorted(set(int_list(top_k, "--top-k")))
    if corpus is not None and not corpus.exists():
        fail(f"no such file or folder: {corpus}")
    root = store or turborag_home() / "bench-ask-store"
    if store is None and root.exists():
        import shutil

        shutil.rmtree(root)  # our own scratch store: fresh caches so ingest throughput is real
    catalog = open_catalog(root, create=True)
    engine = load_engine(catalog, model, device, None, ingest=True, chunk_tokens=256, chunk_overlap=32)
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
