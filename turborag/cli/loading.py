"""Opening engines and stores for the commands, with every failure turned into one error line.

Two ways in: `engine_for` loads a model by name over a scratch cache store (demo, eval, bench), and
`load_engine` loads the model a store was built with and checks it against the store's catalog (ingest, ask,
serve): a store remembers its model, template, cache dtype and chunking, and a different one is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from turborag.cli.common import console, fail
from turborag.core.defaults import DEFAULT_MODEL, turborag_home

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
    cache_dtype: str | None = None,
):
    """An engine over a cache store that is not bound to a catalog (default: $TURBORAG_HOME/eval-store).
    Caches are kept in the compute dtype when it is 16-bit, else in fp16 (`cache_dtype` overrides)."""
    import transformers

    from turborag.core.engine import Engine
    from turborag.core.model import ModelError, cache_dtype_for, load_model
    from turborag.store.kv_store import KVStore

    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars under our own status line
    try:
        with console.status(f"loading {model}"):
            lm = load_model(model, device, dtype)
        kv = KVStore(store or turborag_home() / "eval-store", cache_dtype or cache_dtype_for(lm.dtype))
        return Engine(lm, kv, template)
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
    ram_cache_bytes: int = 0,
    max_disk_bytes: int | None = None,
    cache_format: str | None = None,
    **settings,
):
    """The engine for this store; with `ingest`, binds a new store to the model (and settings).

    The store remembers the compute dtype its caches were made in (a cache is only valid for that dtype),
    so `--dtype` defaults to the store's; a store from before `--dtype` existed was computed in fp32 on CPU.
    """
    import transformers

    from turborag.core.engine import Engine
    from turborag.core.model import (
        ModelError,
        cache_dtype_for,
        dtype_name,
        legacy_dtype,
        load_model,
        resolve_device,
        resolve_dtype,
    )
    from turborag.rag.embed import EMBEDDER
    from turborag.rag.ingest import check_keys
    from turborag.store.catalog import StoreError
    from turborag.store.kv_store import KVStore

    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars; ingest draws its own
    meta = catalog.meta()
    bound_before = "model_fingerprint" in meta
    if not ingest and not bound_before:
        fail(f"store {catalog.root} is empty: run `turborag ingest PATH --store {catalog.root}` first")
    spec = _model_spec(model or meta.get("model") or DEFAULT_MODEL)
    try:
        dev = resolve_device(device)
        if dtype is None and "dtype" in meta:
            dtype = meta["dtype"]
        elif dtype is None and bound_before:
            dtype = dtype_name(legacy_dtype(dev))
        compute = resolve_dtype(dtype, dev)
        store_dtype = meta.get("store_dtype") or cache_format or cache_dtype_for(compute)
        if cache_format and cache_format != store_dtype:
            fail(
                f"store {catalog.root} keeps its caches as {store_dtype}, not {cache_format}: "
                "use another --store"
            )
        if bound_before:  # before loading: a different dtype also changes the fingerprint, so say which
            catalog.check_settings(dtype=dtype_name(compute))
        with console.status(f"loading {spec}"):
            lm = load_model(spec, device, compute)
        kv = KVStore(_kv_backend(catalog, kv_url, bind=ingest, max_disk_bytes=max_disk_bytes), store_dtype)
        engine = Engine(lm, kv, template or meta.get("template") or "auto", ram_cache_bytes=ram_cache_bytes)
        bound = dict(
            template=engine.layout.template,
            store_dtype=engine.store.dtype,
            embedder=EMBEDDER,
            dtype=dtype_name(compute),
            **settings,
        )
        if ingest:
            catalog.bind(spec, lm.fingerprint, **bound)
        else:
            catalog.check(spec, lm.fingerprint, **bound)
        check_keys(catalog, engine)
        return engine
    except (ModelError, StoreError, ValueError) as e:
        fail(str(e))


def store_kv(catalog: Catalog):
    """The KV cache store of an open catalog, in the cache dtype it was built with."""
    from turborag.store.kv_store import KVStore

    return KVStore(_kv_backend(catalog), catalog.meta().get("store_dtype", "float16"))


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
        catalog.set_meta(max_disk_bytes=str(max_disk_bytes))
    cap = int(catalog.meta().get("max_disk_bytes", 0)) or None
    recorded = catalog.meta().get("kv_url")
    if kv_url and recorded != kv_url and (recorded or "model_fingerprint" in catalog.meta()):
        where = recorded or f"its own folder ({catalog.root / 'kv'})"
        fail(f"store {catalog.root} keeps its caches in {where}, not {kv_url}: use another --store for that")
    try:
        backend = open_backend(recorded or kv_url or catalog.root, max_disk_bytes=cap)
    except (StoreUnavailable, ValueError, ImportError) as e:
        fail(str(e))
    if bind and kv_url and not recorded:
        catalog.set_meta(kv_url=kv_url)
    return backend
