"""`turborag cache stats | verify | gc`: the store's KV cache files."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path

import typer
from rich.table import Table

from turborag.cli.common import CollectionOpt, JsonOpt, StoreOpt, fail, plural, stdout
from turborag.cli.loading import open_catalog, store_kv

# The store (and through it torch) is imported inside the commands, so that loading the CLI stays light.

app = typer.Typer(help="The store's KV caches: stats, verify, gc.", no_args_is_help=True)


# What each `cache stats` number counts, said in its table: entries are what the catalog names, files what is
# on disk, and the tokens are not the ones ingest reports (see the caption).
_STATS_LABELS = {
    "files": "source files",
    "tokens": "chunk text tokens",
    "cache_entries": "cache entries (catalog)",
    "cache_files": "cache files present",
    "missing_caches": "cache files missing",
    "cache_bytes": "cache bytes (files present)",
    "disk_bytes": "bytes of all cache files",
    "orphan_files": "orphan cache files (gc removes)",
    "backend": "cache backend",
    "disk_tier": "disk tier (--max-disk-bytes)",
}
_STATS_CAPTION = (
    "chunk text tokens: every chunk's text alone, without the \"Passage: \" wrapping that ingest's token "
    "count includes. Cache entries are the caches the catalog names; a missing file (e.g. removed by "
    "`cache verify`) is recomputed by the next ingest."
)


@app.command("stats")
def cache_stats(store: Path = StoreOpt, collection: str = CollectionOpt, as_json: bool = JsonOpt) -> None:
    """Documents, chunks, tokens and caches of a collection: the catalog's cache entries its chunks use
    (shared with other collections holding the same text), and which of their files are on disk (a damaged
    file that `cache verify` removed is counted as missing, not present)."""
    catalog = open_catalog(store, create=False, collection=collection)
    stats = _stats(catalog)
    _warn_missing(stats)
    if as_json:
        typer.echo(json.dumps(stats))
        return
    table = Table(title=f"store {catalog.root}", caption=_STATS_CAPTION, show_header=False)
    for k, v in stats.items():
        if k == "disk_tier" and v:
            used, cap = f"{v['bytes']:,}", f"{v['max_bytes']:,}"
            v = f"{used} of {cap} bytes, {v['entries']:,} caches, {v['evictions']:,} evicted"
        if isinstance(v, list):
            v = ", ".join(v)
        if k != "store" and v is not None:
            label = _STATS_LABELS.get(k, k.replace("_", " "))
            table.add_row(label, f"{v:,}" if isinstance(v, int) else str(v))
    stdout().print(table)


def _stats(catalog) -> dict:
    """What `cache stats` reports, in its JSON shape."""
    settings = catalog.settings()
    counts = catalog.stats()
    kv = store_kv(catalog)
    sizes = {key: kv.size(key) or 0 for key in kv.keys()}  # every stored cache, named or not
    on_disk = set(sizes)
    entries = catalog.collection_cache_entries()
    known = {k for k, _ in catalog.cache_entries()}  # an orphan is a file no collection names
    present = [b for k, b in entries if k in on_disk]
    return dict(
        documents=counts["documents"],
        files=counts["files"],
        chunks=counts["chunks"],
        tokens=counts["tokens"],
        cache_entries=counts["cache_entries"],
        cache_files=len(present),
        missing_caches=len(entries) - len(present),
        cache_bytes=sum(present),
        store=str(catalog.root),
        collection=catalog.collection,
        collections=catalog.collections(),
        model=settings.model,
        model_fingerprint=settings.model_fingerprint,
        chunk_tokens=settings.chunk_tokens,
        chunk_overlap=settings.chunk_overlap,
        cache_format=settings.cache_format,
        disk_bytes=sum(sizes.values()),
        orphan_files=sum(1 for key in sizes if key not in known),
        backend=kv.backend.url,
        disk_tier=kv.backend.stats() if hasattr(kv.backend, "stats") else None,
    )


def _warn_missing(stats: dict) -> None:
    """A line on stderr when caches are missing: evicted by the disk cap, or gone."""
    missing = stats["missing_caches"]
    if missing and stats["disk_tier"] and stats["disk_tier"]["evictions"]:
        typer.echo(
            f"{plural(missing, 'chunk cache')} evicted by the disk cap ({stats['disk_tier']['max_bytes']:,} "
            "bytes): recomputed and stored again when a question needs them",
            err=True,
        )
    elif missing:
        one = missing == 1
        typer.echo(
            f"{plural(missing, 'chunk cache')} {'is' if one else 'are'} missing: `turborag ingest` on the "
            f"same paths recomputes {'it' if one else 'them'} (so does `ask`, when needed)",
            err=True,
        )


@app.command("verify")
def cache_verify(
    store: Path = StoreOpt,
    as_json: bool = JsonOpt,
    migrate: bool = typer.Option(
        False, "--migrate", help="rewrite every readable format-1 cache as format 2 (same keys, atomic)"
    ),
    repair: bool = typer.Option(
        False, "--repair", help="recompute the missing and damaged caches (loads the store's model)"
    ),
) -> None:
    """Read every cache file and check its checksums. Damaged files are removed (never used); exit 1 if any
    cache is missing or damaged. `turborag ingest` on the same paths recomputes them (so does `ask`).
    Format-1 caches (earlier turborag) are read whole on every use; --migrate rewrites them as format 2,
    whose requests read only the layers they need."""
    catalog = open_catalog(store, create=False)
    ok, missing, damaged, formats, migrated = _verify_all(catalog, migrate)
    out = {"ok": ok, "missing": len(missing), "damaged": len(damaged), "formats": formats}
    if migrate:
        out["migrated"] = migrated
    repaired = 0
    if repair and (missing or damaged):
        repaired = out["repaired"] = _repair(catalog, missing + damaged)
    if as_json:
        typer.echo(json.dumps(out))
    else:
        # A damaged file is removed as soon as it is found: say so, but only when there was one.
        bad = f"{len(damaged)} damaged and removed" if damaged else "0 damaged"
        typer.echo(
            f"{plural(ok, 'chunk cache')} ok (format 2: {formats['2']}, format 1: {formats['1']}), "
            f"{len(missing)} missing, {bad}"
            + (f", {migrated} migrated to format 2" if migrate else "")
            + (f", {repaired} recomputed" if repaired else ""),
            err=True,
        )
    if formats["1"] and not migrate:
        # The count is a parenthesis, which reads right for any number (and tests/store asserts this line).
        typer.echo(
            f"format-1 caches ({formats['1']}) are still read, through the slower whole-file path; "
            f"`turborag cache verify --migrate --store {catalog.root}` rewrites them as format 2",
            err=True,
        )
    n = len(missing) + len(damaged) - repaired
    if n:
        fail(
            f"{plural(n, 'chunk cache')} {'needs' if n == 1 else 'need'} recomputing: run `turborag cache "
            f"verify --repair --store {catalog.root}` (or let `ask` recompute {'it' if n == 1 else 'them'} "
            "when needed)",
            code=1,
        )


def _verify_all(catalog, migrate: bool) -> tuple[int, list[str], list[str], dict[str, int], int]:
    """Read and check every cache the catalog names: (ok, missing keys, damaged keys, formats of the ok
    ones as found, migrated). A damaged file is removed by the read; with `migrate`, format-1 caches are
    rewritten as format 2."""
    from turborag.store.catalog import StoreError

    kv = store_kv(catalog)
    ok, missing, damaged, migrated = 0, [], [], 0
    formats = {"1": 0, "2": 0}  # of the caches that read ok, as found (before any migration)
    # Migrating writes files and the catalog's byte counts: one writer at a time, like ingest and gc.
    # A plain verify only reads (and removes damaged files, which no reader would use anyway).
    lock = catalog.write_lock() if migrate else contextlib.nullcontext()
    try:
        with lock:
            for key, _ in catalog.cache_entries():
                exists = key in kv
                fmt = kv.file_format(key)  # before get, which removes a damaged file
                chunk = kv.get(key)
                if chunk is not None:
                    ok += 1
                    if fmt in formats:  # None only if the file was replaced in between
                        formats[fmt] += 1
                    if migrate and fmt == "1":
                        catalog.set_cache_bytes(key, kv.put(key, chunk))  # atomic: old or new, never neither
                        migrated += 1
                elif exists:
                    damaged.append(key)
                else:
                    missing.append(key)
    except StoreError as e:
        fail(str(e))
    except OSError as e:  # e.g. disk full: every cache not yet migrated is still intact, in format 1
        fail(
            f"migration stopped after {plural(migrated, 'chunk cache')} ({e}); the others are unchanged and "
            "still readable"
        )
    return ok, missing, damaged, formats, migrated


def _repair(catalog, keys: list[str]) -> int:
    """Recompute the caches of `keys` from their chunks' text (e.g. after a Redis store restarted empty)."""
    from turborag.cli.loading import load_engine
    from turborag.store.catalog import StoreError
    from turborag.store.errors import StoreUnavailable

    engine = load_engine(catalog, None, "cpu", None)  # the store's model; refuses a store of another version
    texts = catalog.texts_of_keys(keys)
    try:
        with catalog.write_lock():
            # under the catalog's keys, not keys derived again: a store may key caches per collection
            engine.precompute_ids({k: engine.layout.chunk_ids(t) for k, t in texts.items()})
            for key in texts:
                catalog.set_cache_bytes(key, engine.store.size(key) or 0)
    except (StoreError, StoreUnavailable) as e:
        fail(str(e))
    return sum(1 for key in texts if key in engine.store)


# An upload folder younger than this is left alone by `cache gc`: a server writes the upload before its ingest
# takes the store's write lock, so a fresh folder the catalog does not name yet may be an upload in flight.
UPLOAD_GRACE_S = 3600


@app.command("gc")
def cache_gc(store: Path = StoreOpt, as_json: bool = JsonOpt) -> None:
    """Delete caches no chunk uses (left by changed, removed or killed ingests), stale temp files, and
    uploads of a server killed mid-ingest (folders under uploads/ that no document comes from, over an
    hour old)."""
    from turborag.rag.ingest import free_caches
    from turborag.serve import upload_journal
    from turborag.store.catalog import StoreError

    catalog = open_catalog(store, create=False)
    kv = store_kv(catalog)
    files = freed = 0
    try:
        with catalog.write_lock():  # no ingest is running: every file the catalog does not name is garbage
            freed += free_caches(catalog, kv)
            known = {k for k, _ in catalog.cache_entries()}
            for key in [k for k in kv.keys() if k not in known]:
                freed += kv.delete(key)
                files += 1
            garbage = kv.backend.stray_files() if hasattr(kv.backend, "stray_files") else []
            garbage += list(catalog.root.glob(".tmp-*index*.safetensors"))
            for f in garbage:
                freed += f.stat().st_size
                f.unlink()
                files += 1
            recovered = upload_journal.recover(catalog, kv)  # uploads a crash cut short, whatever their age
            freed += recovered.bytes
            files += recovered.files
            for folder in orphan_uploads(catalog):
                removed = [f for f in folder.rglob("*") if f.is_file()]
                freed += sum(f.stat().st_size for f in removed)
                files += len(removed)
                shutil.rmtree(folder, ignore_errors=True)
            catalog.vacuum()
    except StoreError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps({"files_removed": files, "bytes_freed": freed}))
    else:
        typer.echo(f"removed {plural(files, 'unused file')}, {freed / 1e6:.1f} MB freed", err=True)


def orphan_uploads(catalog, now: float | None = None) -> list[Path]:
    """Upload folders (`<store>/uploads/<id>/`, written by a server before it ingests them) that no document
    of any collection comes from and that are over UPLOAD_GRACE_S old: left by a server killed mid-ingest.
    The caller holds the write lock, so no ingest is running; the age spares an upload not yet locked."""
    uploads = catalog.root / "uploads"
    if not uploads.is_dir():
        return []
    cutoff = (now if now is not None else time.time()) - UPLOAD_GRACE_S
    return [
        folder
        for folder in sorted(uploads.iterdir())
        if folder.is_dir()
        and not folder.with_name(folder.name + ".ingesting").exists()  # in the journal: an upload in flight
        and _newest_mtime(folder) < cutoff
        and not catalog.any_document_under(str(folder.resolve()))
    ]


def _newest_mtime(folder: Path) -> float:
    """The newest modification time of a folder and everything in it."""
    return max([folder.stat().st_mtime, *(f.stat().st_mtime for f in folder.rglob("*"))])
