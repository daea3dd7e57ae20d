"""Opening engines and stores for the commands, with every failure turned into one error line.

Two ways in: `engine_for` loads a model by name over a scratch cache store (demo, eval, bench), and
`load_engine` loads the model a store was built with and checks it against the store's catalog (ingest, ask,
serve): a store remembers its model, template, cache dtype and chunking, and a different one is refused.
"""

from __future__ import annotations

from pathlib import Path

from turborag.cli.common import console, fail
from turborag.core.model import DEFAULT_MODEL, ModelError, turborag_home
from turborag.store.catalog import Catalog, StoreError


def engine_for(model: str, device: str, store: Path | None, template: str, store_dtype: str = "float16"):
    """An engine over a cache store that is not bound to a catalog (default: $TURBORAG_HOME/eval-store)."""
    from turborag.core.engine import Engine
    from turborag.core.model import load_model
    from turborag.store.kv_store import KVStore

    try:
        with console.status(f"loading {model}"):
            lm = load_model(model, device)
        return Engine(lm, KVStore(store or turborag_home() / "eval-store", store_dtype), template)
    except ModelError as e:
        fail(str(e))
    except ValueError as e:
        fail(str(e))


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

    from turborag.core.engine import Engine
    from turborag.core.model import load_model
    from turborag.rag.embed import EMBEDDER
    from turborag.store.kv_store import KVStore

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


def store_kv(catalog: Catalog):
    """The KV cache store of an open catalog, in the cache dtype it was built with."""
    from turborag.store.kv_store import KVStore

    return KVStore(catalog.root, catalog.meta().get("store_dtype", "float16"))
