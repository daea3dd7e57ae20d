"""`turborag cache stats | verify | gc`: the store's KV cache files."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from turborag.cli.common import JsonOpt, StoreOpt, fail
from turborag.cli.loading import open_catalog, store_kv
from turborag.store.catalog import StoreError

app = typer.Typer(help="The store's KV caches: stats, verify, gc.", no_args_is_help=True)


def _cache_files(root: Path) -> list[Path]:
    kv = root / "kv"
    return sorted(kv.glob("*/*.safetensors")) if kv.is_dir() else []


@app.command("stats")
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


@app.command("verify")
def cache_verify(store: Path = StoreOpt, as_json: bool = JsonOpt) -> None:
    """Read every cache file and check its checksum. Damaged files are removed (never used); exit 1 if any
    cache is missing or damaged. `turborag ingest` on the same paths recomputes them (so does `ask`)."""
    catalog = open_catalog(store, create=False)
    kv = store_kv(catalog)
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


@app.command("gc")
def cache_gc(store: Path = StoreOpt, as_json: bool = JsonOpt) -> None:
    """Delete caches no chunk uses (left by changed, removed or killed ingests) and stale temp files."""
    from turborag.rag.ingest import INDEX_FILE, free_caches

    catalog = open_catalog(store, create=False)
    kv = store_kv(catalog)
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
