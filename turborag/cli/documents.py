"""`turborag ingest` and `turborag remove`: documents into and out of a store.

Every command is a thin shell: argument checks that need no model come first (a bad path fails at once with
one line and exit 2), then the store is opened and validated, then the model is loaded and checked against
the store. `--store` defaults to `$TURBORAG_HOME/store` (`~/.cache/turborag/store`).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from turborag.cli.common import (
    CollectionOpt,
    DeviceOpt,
    JsonOpt,
    StoreDtypeOpt,
    StoreModelOpt,
    StoreOpt,
    StoreTemplateOpt,
    StoreUrlOpt,
    console,
    fail,
    parse_bytes,
    parse_cache_format,
    plural,
)
from turborag.cli.loading import default_store, load_engine, open_catalog, store_kv
from turborag.core.options import EngineOptions
from turborag.core.progress import PlainProgress

# The store, the model and the RAG pipeline (torch with them) are imported inside the commands, so that
# loading the CLI stays light.


class RichProgress:
    """Ingest progress on stderr: bar, chunks done/total, tokens/s, ETA. When stderr is not a terminal (a log
    file), where a bar shows nothing, a plain line every few seconds instead."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None
        self.plain: PlainProgress | None = None

    def start(self, chunks: int, tokens: int) -> None:
        if not self.enabled or not chunks:
            return
        if not console.is_terminal:
            self.plain = PlainProgress("ingest", chunks, "chunks", stream=console.file)
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
        if self.plain is not None:
            self.plain.update(chunks)
        if self.bar is None:
            return
        self.done += chunks
        self.bar.advance(self.task, tokens)
        speed = self.bar.tasks[0].speed
        self.bar.update(self.task, chunks=self.done, tps=f"{speed:.0f}" if speed else "-")

    def stop(self) -> None:
        if self.plain is not None:
            self.plain.close()
            self.plain = None
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def ingest(
    paths: list[Path] = typer.Argument(
        ..., help="files or folders (.txt .md .html .pdf .jsonl; folders recursively)"
    ),
    store: Path = StoreOpt,
    collection: str = CollectionOpt,
    model: str = StoreModelOpt,
    device: str = DeviceOpt,
    template: str = StoreTemplateOpt,
    dtype: str = StoreDtypeOpt,
    chunk_tokens: int = typer.Option(
        None, min=8, help="chunk size in model tokens (default 256, or the store's)"
    ),
    overlap: int = typer.Option(
        None, min=0, help="chunk overlap in model tokens (default 32, or the store's)"
    ),
    prune: bool = typer.Option(False, "--prune", help="also drop documents whose files are gone"),
    store_url: str = StoreUrlOpt,
    max_disk_bytes: str = typer.Option(
        None,
        "--max-disk-bytes",
        help="cap the store's cache files (e.g. 20G; least recently used evicted, recomputed when asked "
        "for again); recorded in the store, 0 removes the cap",
    ),
    cache_format: str = typer.Option(
        None,
        "--cache-format",
        help="how a new store keeps its caches: the compute dtype (default: bfloat16 on bf16 hardware, "
        "else float16), int8 or fp8 (about half the bytes; docs/BENCHMARKS.md has their accuracy)",
    ),
    ray: str = typer.Option(
        None,
        "--ray",
        help="precompute on a Ray cluster: local (start one on this machine), auto (the cluster this "
        "machine belongs to) or the cluster's ADDRESS; needs `pip install 'turborag[ray]'` and a store "
        "every worker reaches (--store-url redis://..., or a folder they all see)",
    ),
    ray_workers: int = typer.Option(
        2, "--ray-workers", min=1, help="Ray actors, one model each (one GPU each)"
    ),
    isolate_collections: bool = typer.Option(
        False,
        "--isolate-collections",
        help="a new store keys its chunk caches per collection: the same text in two collections is cached "
        "twice, and no request can tell by its speed what another collection holds (chosen when the store "
        "is made)",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="print the documents, chunks, tokens and cache bytes these paths hold, computing and writing "
        "nothing (the store's model, chunking and cache format, or those given)",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Add files to the store: chunk, precompute KV caches, embed. Unchanged files cost nothing; a killed run
    resumes where it stopped."""
    for p in paths:  # before any import below: a mistyped path is answered at once
        if not p.expanduser().exists():
            fail(f"no such file or folder: {p}")
    try:
        cap = parse_bytes(max_disk_bytes) if max_disk_bytes is not None else None
    except ValueError as e:
        fail(f"--max-disk-bytes: {e}")
    fmt = parse_cache_format(cache_format)
    if dry_run:
        _dry_run(paths, store, model, device, template, dtype, chunk_tokens, overlap, fmt, as_json)
        return
    from turborag.rag.chunker import Chunker, check_params, chunking
    from turborag.rag.embed import Embedder
    from turborag.rag.ingest import IngestInterrupted, Ingestor, StoreWriteError
    from turborag.store.catalog import StoreError

    _refuse_a_new_store_with_nothing_to_read(paths, store)
    catalog = open_catalog(store, create=True, collection=collection)
    try:
        recorded = catalog.settings()
        size, ovl = chunking(recorded.chunk_tokens, recorded.chunk_overlap, chunk_tokens, overlap)
        try:
            check_params(size, ovl)
        except ValueError as e:
            fail(str(e))
        engine = load_engine(
            catalog,
            model,
            device,
            template,
            ingest=True,
            dtype=dtype,
            kv_url=store_url,
            max_disk_bytes=cap,
            cache_format=fmt,
            chunk_tokens=size,
            chunk_overlap=ovl,
            options=EngineOptions(isolate_collections=isolate_collections),
        )
    except typer.Exit:
        catalog.discard()  # a store this run created, bound to nothing yet: not left behind
        raise
    chunker = Chunker(engine.lm.tokenizer, size, ovl)
    remote = _ray_remote(engine, catalog, ray, ray_workers) if ray else None
    progress = RichProgress(enabled=not as_json)
    ingestor = Ingestor(engine, catalog, Embedder(), chunker, progress=progress, remote=remote)
    try:
        res = ingestor.run(paths, prune=prune)
    except IngestInterrupted as e:
        _interrupted(e.saved, e.total)
    except StoreWriteError as e:
        fail(str(e), code=1)
    except (FileNotFoundError, StoreError) as e:
        fail(str(e))
    _report_ingest(res, paths, catalog, as_json)


def _refuse_a_new_store_with_nothing_to_read(paths: list[Path], store: Path | None) -> None:
    """A new store and no file it could read: say so before creating anything or loading the model."""
    from turborag.rag.loaders import LoadReport, find_files
    from turborag.store.catalog import is_store

    if is_store((store or default_store()).expanduser()):
        return
    report = LoadReport()
    if not find_files(paths, report):
        _print_skipped(report.skipped)
        fail(f"{_nothing_to_ingest(paths, len(report.skipped))}; no store was created", code=1)


def _dry_run(paths, store, model, device, template, dtype, chunk_tokens, overlap, fmt, as_json) -> None:
    """`ingest --dry-run`: what the paths would add, with the store's settings where it has them."""
    from turborag.core.arch import kv_shape
    from turborag.core.defaults import DEFAULT_MODEL
    from turborag.core.model import ModelError, cache_format_for, load_model
    from turborag.core.prompt import PromptLayout
    from turborag.rag.chunker import Chunker, check_params, chunking
    from turborag.rag.ingest import plan
    from turborag.store import codec
    from turborag.store.catalog import is_store
    from turborag.store.settings import StoreSettings

    root = (store or default_store()).expanduser()
    recorded = StoreSettings()
    if is_store(root):
        catalog = open_catalog(root, create=False, read_only=True)
        recorded = catalog.settings()
        catalog.close()
    size, ovl = chunking(recorded.chunk_tokens, recorded.chunk_overlap, chunk_tokens, overlap)
    try:
        check_params(size, ovl)
        lm = load_model(model or recorded.model or DEFAULT_MODEL, device, dtype or recorded.dtype or "auto")
    except (ValueError, ModelError) as e:
        fail(str(e))
    fmt = fmt or recorded.cache_format or cache_format_for(lm.dtype)
    layers, kv_heads, head_dim = kv_shape(lm.model)
    layout = PromptLayout(lm.tokenizer, template or recorded.template or "auto")
    found = plan(
        paths,
        Chunker(lm.tokenizer, size, ovl),
        layout.chunk_ids,
        lambda tokens: codec.tensor_bytes(fmt, layers, kv_heads, tokens, head_dim),
    )
    _print_skipped(found.skipped)
    if as_json:
        typer.echo(json.dumps({**found.summary(), "cache_format": fmt}))
        return
    typer.echo(
        f"{plural(found.documents, 'document')}, {plural(found.chunks, 'chunk')} of {size} tokens: "
        f"{plural(found.tokens, 'token')} to compute once, {found.cache_bytes / 1e6:.1f} MB of {fmt} caches "
        f"(nothing computed or written; a rerun skips what the store already holds)"
    )


def _interrupted(saved: int, total: int) -> None:
    """Ctrl-C: one line saying what is kept, so that nobody starts over from scratch; exit 130 (SIGINT)."""
    done = f"{saved} of {plural(total, 'chunk cache')} saved" if total else "no chunk cache computed yet"
    typer.echo(f"interrupted: {done}; run the same command again to resume", err=True)
    raise typer.Exit(130)


def _ray_remote(engine, catalog, address: str, workers: int):
    """The remote precompute of `ingest --ray`: Ray actors rebuilding this engine (rag/ray_precompute.py)."""
    import functools

    try:
        import ray  # noqa: F401
    except ImportError:
        fail("--ray needs Ray: pip install 'turborag[ray]'")
    from turborag.rag.ray_precompute import WorkerSpec, precompute_on_ray

    settings = catalog.settings()
    spec = WorkerSpec(
        model=settings.model,
        device=engine.lm.device.type,
        dtype=settings.dtype,
        template=engine.layout.template,
        store_url=settings.kv_url or str(catalog.root),
        cache_format=engine.store.cache_format,
        fingerprint=engine.lm.fingerprint,
        max_disk_bytes=settings.max_disk_bytes or None,
        batch_size=engine.batch_size,
        collection=catalog.collection if engine.isolate_collections else None,
    )
    return functools.partial(precompute_on_ray, spec=spec, address=address, workers=workers)


def _report_ingest(res, paths: list[Path], catalog, as_json: bool) -> None:
    """What an ingest did: skipped files and warnings on stderr, then the JSON summary or one line."""
    _print_skipped(res.skipped)
    for w in res.warnings:
        typer.echo(f"warning: {w}", err=True)
    if not res.documents:
        nothing = _nothing_to_ingest(paths, len(res.skipped))
        if catalog.discard():  # the store is new and holds nothing: exit 1, as if it had never been made
            fail(f"{nothing}; no store was created", code=1)
        typer.echo(f"warning: {nothing}", err=True)
    if res.gone_documents:
        n = res.gone_documents
        typer.echo(
            f"warning: {plural(n, 'document')} under {_names(paths)} {'is' if n == 1 else 'are'} gone from "
            f"disk but still searchable in the store; ingest with --prune to drop "
            f"{'it' if n == 1 else 'them'}",
            err=True,
        )
    if as_json:
        typer.echo(json.dumps(res.summary()))
        return
    tps = f" ({res.tokens / res.seconds:.0f} tokens/s)" if res.tokens and res.seconds else ""
    computed = f"Computed {plural(res.computed_chunks, 'chunk cache')}"
    if res.tokens:  # not the catalog's count (`cache stats`: chunk texts alone), so say what this one is
        computed += (
            f': {plural(res.tokens, "token")} as the prompt holds them ("Passage: " wrapping included)'
        )
    typer.echo(
        f"{plural(res.documents, 'document')} ({res.unchanged_documents} unchanged), "
        f"{plural(res.chunks, 'chunk')}: {res.new_chunks} new, {res.removed_chunks} removed"
        + (f", {plural(res.pruned_documents, 'document')} pruned" if res.pruned_documents else "")
        + f". {computed} in {res.seconds:.1f} s{tps}"
        + (f", {res.cache_bytes / 1e6:.1f} MB written" if res.cache_bytes else "")
        + (
            f" ({plural(res.repaired_caches, 'missing chunk cache')} recomputed)"
            if res.repaired_caches
            else ""
        )
        + (f"; {plural(res.found_caches, 'chunk cache')} already in the store" if res.found_caches else "")
        + f". Store: {catalog.root}"
    )


def _print_skipped(skipped: list[tuple[str, str]]) -> None:
    for path, reason in skipped:
        typer.echo(f"skipped {path}: {reason}", err=True)


def _names(paths: list[Path]) -> str:
    return ", ".join(map(str, paths))


def _nothing_to_ingest(paths: list[Path], skipped: int) -> str:
    """The one line for a run that found no document: which paths, and whether anything was there at all
    (the skipped files are named on the lines above it)."""
    found = f"no supported, readable document ({plural(skipped, 'file')} skipped)"
    return f"nothing to ingest in {_names(paths)}: {found if skipped else 'no files found'}"


def remove(
    paths: list[Path] = typer.Argument(
        ..., help="files or folders whose documents to drop (they may be gone)"
    ),
    store: Path = StoreOpt,
    collection: str = CollectionOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Drop documents from a collection of the store, and the caches no other document uses."""
    catalog = open_catalog(store, create=False, collection=collection)  # a missing store: before torch
    from turborag.rag.ingest import StoreWriteError
    from turborag.rag.ingest import remove as remove_documents
    from turborag.store.catalog import StoreError

    try:
        docs, chunks = remove_documents(catalog, store_kv(catalog), paths)
    except StoreError as e:
        fail(str(e))
    except OSError as e:
        fail(str(StoreWriteError(f"could not write the store at {catalog.root}: {e}")), code=1)
    if as_json:
        typer.echo(json.dumps({"documents": docs, "chunks": chunks}))
    elif docs:
        typer.echo(f"removed {plural(docs, 'document')} ({plural(chunks, 'chunk')}) from {catalog.root}")
    if not docs:
        fail(f"nothing in {catalog.root} comes from {', '.join(map(str, paths))}", code=1)
