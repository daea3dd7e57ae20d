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
    DeviceOpt,
    JsonOpt,
    StoreDtypeOpt,
    StoreModelOpt,
    StoreOpt,
    StoreTemplateOpt,
    console,
    fail,
)
from turborag.cli.loading import load_engine, open_catalog, store_kv
from turborag.store.catalog import StoreError


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


def ingest(
    paths: list[Path] = typer.Argument(
        ..., help="files or folders (.txt .md .html .pdf .jsonl; folders recursively)"
    ),
    store: Path = StoreOpt,
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
    as_json: bool = JsonOpt,
) -> None:
    """Add files to the store: chunk, precompute KV caches, embed. Unchanged files cost nothing; a killed run
    resumes where it stopped."""
    from turborag.rag.chunker import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, Chunker, check_params
    from turborag.rag.embed import Embedder
    from turborag.rag.ingest import Ingestor, StoreWriteError

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
    engine = load_engine(
        catalog, model, device, template, ingest=True, dtype=dtype, chunk_tokens=size, chunk_overlap=ovl
    )
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


def remove(
    paths: list[Path] = typer.Argument(
        ..., help="files or folders whose documents to drop (they may be gone)"
    ),
    store: Path = StoreOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Drop documents (and their caches) from the store."""
    from turborag.rag.ingest import StoreWriteError
    from turborag.rag.ingest import remove as remove_documents

    catalog = open_catalog(store, create=False)
    try:
        docs, chunks = remove_documents(catalog, store_kv(catalog), paths)
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
