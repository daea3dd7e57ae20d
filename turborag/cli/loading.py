"""Opening engines and stores for the commands, with every failure turned into one error line.

Two ways in: `engine_for` loads a model by name over a scratch cache store (demo, eval, bench), and
`load_engine` loads the model a store was built with and checks it against the store's catalog (ingest, ask,
serve): a store remembers its model, template, cache dtype and chunking, and a different one is refused.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from turborag.cli.common import console, fail
from turborag.core.defaults import DEFAULT_MODEL, turborag_home
from turborag.core.options import EngineOptions

if TYPE_CHECKING:
    from turborag.store.catalog import Catalog

# torch, transformers and the store are imported inside the functions that need them: `turborag ask` that
# answers through a running server, and `--help`, never load them.


def engine_for(
    model: str,
    device: str,
    store: Path | None,
    template: str,
    dtype: str = "auto",
    cache_format: str | None = None,
    options: EngineOptions | None = None,
):
    """An engine over a cache store that is not bound to a catalog (default: $TURBORAG_HOME/eval-store).
    Caches are kept in the compute dtype when it is 16-bit, else in fp16 (`cache_format` overrides)."""
    import transformers

    from turborag.core.engine import Engine
    from turborag.core.model import ModelError, cache_format_for, load_model
    from turborag.store.kv_store import KVStore

    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars under our own status line
    try:
        with console.status(f"loading {model}"):
            lm = load_model(model, device, dtype)
        kv = KVStore(store or turborag_home() / "eval-store", cache_format or cache_format_for(lm.dtype))
        return Engine(lm, kv, replace(options or EngineOptions(), template=template))
    except ModelError as e:
        fail(str(e))
    except ValueError as e:
        fail(str(e))


def default_store() -> Path:
    return turborag_home() / "store"


def open_catalog(
    store: Path | None, create: bool, collection: str | None = None, read_only: bool = False
) -> Catalog:
    """The store's catalog, seen through `collection` (created with the store when `create`; opened with
    SQLite's mode=ro when `read_only`); one `error:` line for a missing store or collection."""
    from turborag.store.catalog import DEFAULT_COLLECTION, Catalog, StoreError, check_collection_name

    try:
        if collection is not None:
            check_collection_name(collection)  # before a new store is made for it
        catalog = Catalog(store or default_store(), create=create, read_only=read_only)
        if collection is None or collection == DEFAULT_COLLECTION:
            return catalog
        return catalog.use(collection, create=create)
    except StoreError as e:
        fail(str(e))


def _model_spec(spec: str) -> str:
    """Paths are remembered absolute, so the store works from any working directory."""
    if spec == DEFAULT_MODEL:
        return spec
    p = Path(spec).expanduser()
    return str(p.resolve()) if p.exists() else spec


def load_engine(
    catalog: Catalog,
    model: str | None,
    device: str,
    template: str | None,
    ingest: bool = False,
    dtype: str | None = None,
    kv_url: str | None = None,
    max_disk_bytes: int | None = None,
    cache_format: str | None = None,
    chunk_tokens: int | None = None,
    chunk_overlap: int | None = None,
    options: EngineOptions | None = None,
):
    """The engine for this store; with `ingest`, binds a new store to the model (and chunking). `options`
    are the engine's (its template is the store's unless `template` is given).

    The store remembers the compute dtype its caches were made in (a cache is only valid for that dtype),
    so `--dtype` defaults to the store's; a store from before `--dtype` existed was computed in fp32 on CPU.
    """
    import transformers

    from turborag.core.engine import Engine
    from turborag.core.model import ModelError, dtype_name, load_model
    from turborag.rag.embed import EMBEDDER
    from turborag.rag.ingest import check_keys
    from turborag.store.catalog import StoreError
    from turborag.store.kv_store import KVStore
    from turborag.store.settings import SettingsError, StoreSettings

    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars; ingest draws its own
    try:
        recorded = catalog.settings()
    except SettingsError as e:
        fail(f"store {catalog.root}: {e}")
    if not ingest and not recorded.bound:
        fail(f"store {catalog.root} is empty: run `turborag ingest PATH --store {catalog.root}` first")
    spec = _model_spec(model or recorded.model or DEFAULT_MODEL)
    try:
        compute, fmt = _dtypes(catalog, recorded, device, dtype, cache_format)
        if recorded.bound:  # before loading: a different dtype also changes the fingerprint, so say which
            catalog.check(StoreSettings(dtype=dtype_name(compute)))
        with console.status(f"loading {spec}"):
            lm = load_model(spec, device, compute)
        kv = KVStore(_kv_backend(catalog, kv_url, bind=ingest, max_disk_bytes=max_disk_bytes), fmt)
        template = template or recorded.template or "auto"
        engine = Engine(lm, kv, replace(options or EngineOptions(), template=template))
        bound = StoreSettings(
            model=spec,
            model_fingerprint=lm.fingerprint,
            template=engine.layout.template,
            dtype=dtype_name(compute),
            cache_format=engine.store.cache_format,
            embedder=EMBEDDER,
            chunk_tokens=chunk_tokens,
            chunk_overlap=chunk_overlap,
        )
        if ingest:
            catalog.bind(bound)
        else:
            catalog.check(bound)
        check_keys(catalog, engine)
        return engine
    except (ModelError, StoreError, ValueError) as e:
        fail(str(e))


def _dtypes(catalog: Catalog, recorded, device: str, dtype: str | None, cache_format: str | None):
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
        fail(f"store {catalog.root} keeps its caches as {fmt}, not {cache_format}: use another --store")
    return compute, fmt


def store_kv(catalog: Catalog):
    """The KV cache store of an open catalog, in the cache dtype it was built with."""
    from turborag.store.kv_store import KVStore

    return KVStore(_kv_backend(catalog), catalog.settings().cache_format or "float16")


def _kv_backend(
    catalog: Catalog, kv_url: str | None = None, bind: bool = False, max_disk_bytes: int | None = None
):
    """Where this store's chunk caches live: the catalog records a `--store-url` given when the store was
    first ingested into (a store without one keeps them in its own folder, `kv/`). A different URL for a
    store bound to one is refused; an unreachable store is one `error:` line. The disk cap
    (`--max-disk-bytes`) is recorded too, so every process that opens the store keeps to the same cap."""
    from turborag.store.errors import StoreUnavailable
    from turborag.store.urls import open_backend

    if bind and max_disk_bytes is not None:
        catalog.record(max_disk_bytes=max_disk_bytes)
    settings = catalog.settings()
    cap, recorded = settings.max_disk_bytes or None, settings.kv_url
    if kv_url and recorded != kv_url and (recorded or settings.bound):
        where = recorded or f"its own folder ({catalog.root / 'kv'})"
        fail(f"store {catalog.root} keeps its caches in {where}, not {kv_url}: use another --store for that")
    try:
        backend = open_backend(recorded or kv_url or catalog.root, max_disk_bytes=cap)
    except (StoreUnavailable, ValueError, ImportError) as e:
        fail(str(e))
    if bind and kv_url and not recorded:
        catalog.record(kv_url=kv_url)
    return backend
