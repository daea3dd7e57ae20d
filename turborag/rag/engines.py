"""Opening an engine: the one place that turns a store and a model name into a ready `Engine`.

Two ways in:

- `open_engine(store=..., model=...)` (also `turborag.open`): the model a store was built with, checked
  against the store's catalog. A store remembers its model, template, compute dtype, cache format and
  chunking, and a different one is refused: its caches would be useless. With `ingest=True` an empty store
  is bound to the model and settings given. Ingest, ask, serve and scripts use it.
- `scratch_engine(model, store=...)`: a model by name over a cache store bound to no catalog (the
  evaluations, benches and the demo).

Every failure raises a library exception whose message says what to do: `ModelError` (the model),
`StoreError` (the store or its settings), `StoreUnavailable` (a remote store out of reach).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from turborag.core.defaults import DEFAULT_MODEL, NAMED_MODELS, turborag_home
from turborag.core.errors import ModelError
from turborag.core.options import EngineOptions
from turborag.store.catalog import DEFAULT_COLLECTION, Catalog, StoreError, check_collection_name
from turborag.store.errors import StoreUnavailable
from turborag.store.settings import PER_COLLECTION, SHARED, SettingsError, StoreSettings

if TYPE_CHECKING:
    from turborag.core.engine import Engine
    from turborag.store.kv_store import KVStore

# torch is imported inside the functions that load a model or a cache store: opening a catalog (a command
# that answers through a running server, or reports a missing store) never loads it.

__all__ = [
    "ModelError",
    "StoreError",
    "StoreUnavailable",
    "open",
    "open_catalog",
    "open_engine",
    "scratch_engine",
]


def default_store() -> Path:
    return turborag_home() / "store"


def scratch_engine(
    model: str = DEFAULT_MODEL,
    device: str = "cpu",
    store: Path | str | None = None,
    template: str = "auto",
    dtype: str = "auto",
    cache_format: str | None = None,
    options: EngineOptions | None = None,
) -> Engine:
    """An engine over a cache store bound to no catalog (default: $TURBORAG_HOME/eval-store). Caches are
    kept in the compute dtype when it is 16-bit, else in fp16 (`cache_format` overrides)."""
    from turborag.core.engine import Engine
    from turborag.core.model import cache_format_for, load_model
    from turborag.store.kv_store import KVStore

    lm = load_model(model, device, dtype)
    try:
        kv = KVStore(
            Path(store or turborag_home() / "eval-store"), cache_format or cache_format_for(lm.dtype)
        )
    except ValueError as e:
        raise StoreError(str(e)) from None
    return Engine(lm, kv, replace(options or EngineOptions(), template=template))


def open_catalog(
    store: Path | str | None = None,
    create: bool = False,
    collection: str | None = None,
    read_only: bool = False,
) -> Catalog:
    """The store's catalog, seen through `collection` (created with the store when `create`; opened with
    SQLite's mode=ro when `read_only`)."""
    if collection is not None:
        check_collection_name(collection)  # before a new store is made for it
    catalog = Catalog(Path(store or default_store()), create=create, read_only=read_only)
    if collection is None or collection == DEFAULT_COLLECTION:
        return catalog
    return catalog.use(collection, create=create)


def open_engine(
    store: Path | str | Catalog | None = None,
    model: str | None = None,
    device: str = "cpu",
    template: str | None = None,
    ingest: bool = False,
    dtype: str | None = None,
    kv_url: str | None = None,
    max_disk_bytes: int | None = None,
    cache_format: str | None = None,
    chunk_tokens: int | None = None,
    chunk_overlap: int | None = None,
    options: EngineOptions | None = None,
) -> Engine:
    """The engine for a store (a folder, or an open Catalog); with `ingest`, binds an empty store to the
    model (and chunking). `options` are the engine's (its template is the store's unless `template` is
    given). The compute dtype defaults to the store's: a cache is only valid for the dtype it was made in;
    a store from before the dtype was recorded was computed in fp32 on CPU."""
    from turborag.core.engine import Engine
    from turborag.core.model import dtype_name, load_model
    from turborag.rag.ingest import check_keys
    from turborag.store.kv_store import KVStore

    catalog = store if isinstance(store, Catalog) else open_catalog(store, create=ingest)
    try:
        recorded = catalog.settings()
    except SettingsError as e:
        raise StoreError(f"store {catalog.root}: {e}") from None
    if not ingest and not recorded.bound:
        raise StoreError(
            f"store {catalog.root} is empty: run `turborag ingest PATH --store {catalog.root}` first"
        )
    spec = model_spec(model or recorded.model or DEFAULT_MODEL)
    options = options or EngineOptions()
    keys = _cache_keys(catalog, recorded, options.isolate_collections)
    options = replace(options, isolate_collections=keys == PER_COLLECTION)
    compute, fmt = _dtypes(catalog, recorded, device, dtype, cache_format)
    if recorded.bound:  # before loading: a different dtype also changes the fingerprint, so say which
        catalog.check(StoreSettings(dtype=dtype_name(compute)))
    lm = load_model(spec, device, compute)
    try:
        kv = KVStore(_kv_backend(catalog, kv_url, bind=ingest, max_disk_bytes=max_disk_bytes), fmt)
        engine = Engine(lm, kv, replace(options, template=template or recorded.template or "auto"))
    except ValueError as e:
        raise StoreError(str(e)) from None
    bound = StoreSettings(
        model=spec,
        model_fingerprint=lm.fingerprint,
        template=engine.layout.template,
        dtype=dtype_name(compute),
        cache_format=engine.store.cache_format,
        embedder=_embedder(),
        chunk_tokens=chunk_tokens,
        chunk_overlap=chunk_overlap,
        cache_keys=keys,
    )
    if ingest:
        catalog.bind(bound)
    else:
        catalog.check(bound)
    check_keys(catalog, engine)
    return engine


def store_kv(catalog: Catalog) -> KVStore:
    """The KV cache store of an open catalog, in the cache format it was built with."""
    from turborag.store.kv_store import KVStore

    return KVStore(_kv_backend(catalog), catalog.settings().cache_format or "float16")


def model_spec(spec: str) -> str:
    """Paths are remembered absolute, so the store works from any working directory."""
    if spec in NAMED_MODELS:
        return spec
    p = Path(spec).expanduser()
    return str(p.resolve()) if p.exists() else spec


def _embedder() -> str:
    from turborag.rag.embed import EMBEDDER

    return EMBEDDER


def _cache_keys(catalog: Catalog, recorded: StoreSettings, isolate: bool) -> str:
    """How this store keys its caches: as recorded (a store bound before the setting existed shares them);
    a new store as asked. Isolation is chosen when a store is made: its shared caches cannot be split."""
    if not recorded.bound:
        return PER_COLLECTION if isolate else SHARED
    keys = recorded.cache_keys or SHARED
    if isolate and keys != PER_COLLECTION:
        raise StoreError(
            f"store {catalog.root} shares its caches across collections; --isolate-collections is chosen "
            "when a store is made: ingest into a new --store"
        )
    return keys


def _dtypes(
    catalog: Catalog, recorded: StoreSettings, device: str, dtype: str | None, cache_format: str | None
):
    """(compute dtype, cache format) for this store: as asked, else as the store recorded, else the
    defaults; a cache format other than the store's is refused."""
    from turborag.core.model import cache_format_for, dtype_name, legacy_dtype, resolve_device, resolve_dtype

    dev = resolve_device(device)
    if dtype is None and recorded.dtype is not None:
        dtype = recorded.dtype
    elif dtype is None and recorded.bound:
        dtype = dtype_name(legacy_dtype(dev))
    compute = resolve_dtype(dtype, dev)
    fmt = recorded.cache_format or cache_format or cache_format_for(compute)
    if cache_format and cache_format != fmt:
        raise StoreError(
            f"store {catalog.root} keeps its caches as {fmt}, not {cache_format}: use another --store"
        )
    return compute, fmt


def _kv_backend(
    catalog: Catalog, kv_url: str | None = None, bind: bool = False, max_disk_bytes: int | None = None
):
    """Where this store's chunk caches live: the catalog records a `--store-url` given when the store was
    first ingested into (a store without one keeps them in its own folder, `kv/`). A different URL for a
    store bound to one is refused. The disk cap is recorded too, so every process that opens the store
    keeps to the same cap. Opening a store that recorded no cap, `max_disk_bytes` is this process's own."""
    from turborag.store.urls import open_backend

    if bind and max_disk_bytes is not None:
        catalog.record(max_disk_bytes=max_disk_bytes)
    settings = catalog.settings()
    cap, recorded = settings.max_disk_bytes, settings.kv_url
    if cap is None and not bind:
        cap = max_disk_bytes  # this process's own cap, not recorded (a server's default)
    cap = cap or None
    if kv_url and recorded != kv_url and (recorded or settings.bound):
        where = recorded or f"its own folder ({catalog.root / 'kv'})"
        raise StoreError(
            f"store {catalog.root} keeps its caches in {where}, not {kv_url}: use another --store for that"
        )
    try:
        backend = open_backend(recorded or kv_url or catalog.root, max_disk_bytes=cap)
    except (ValueError, ImportError) as e:
        raise StoreError(str(e)) from None
    if bind and kv_url and not recorded:
        catalog.record(kv_url=kv_url)
    return backend


open = open_engine  # noqa: A001 - `turborag.open(store=..., model=...)`, the library's entry point
