"""Opening engines and stores for the commands: the library's `turborag.rag.engines`, with every failure
turned into one error line and a status line while a model loads.

`engine_for` loads a model by name over a scratch cache store (demo, eval, bench); `load_engine` loads the
model a store was built with and checks it against the store's catalog (ingest, ask, serve).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from turborag.cli.common import console, fail
from turborag.core.defaults import turborag_home
from turborag.core.options import EngineOptions

if TYPE_CHECKING:
    from turborag.store.catalog import Catalog

# torch, transformers and the store are imported inside the functions that need them: `turborag ask` that
# answers through a running server, and `--help`, never load them.


@contextlib.contextmanager
def _one_error_line() -> Iterator[None]:
    """The library's exceptions (a model, a store, a setting) as one `error:` line and exit code 1."""
    from turborag.core.errors import ModelError
    from turborag.store.catalog import StoreError
    from turborag.store.errors import StoreUnavailable

    try:
        yield
    except (ModelError, StoreError, StoreUnavailable, ValueError, ImportError) as e:
        fail(str(e))


def _quiet_transformers() -> None:
    import transformers

    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars under our own status line


def engine_for(
    model: str,
    device: str,
    store: Path | None,
    template: str,
    dtype: str = "auto",
    cache_format: str | None = None,
    options: EngineOptions | None = None,
):
    """An engine over a cache store that is not bound to a catalog (rag/engines.py `scratch_engine`)."""
    from turborag.rag.engines import scratch_engine

    _quiet_transformers()
    with _one_error_line(), console.status(f"loading {model}"):
        return scratch_engine(model, device, store, template, dtype, cache_format, options)


def default_store() -> Path:
    return turborag_home() / "store"


def open_catalog(
    store: Path | None, create: bool, collection: str | None = None, read_only: bool = False
) -> Catalog:
    """The store's catalog, seen through `collection`; one `error:` line for a missing store or
    collection."""
    from turborag.rag.engines import open_catalog as opened

    with _one_error_line():
        return opened(store, create, collection, read_only)


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
    """The engine for this store (rag/engines.py `open_engine`); with `ingest`, binds a new store to the
    model (and chunking)."""
    from turborag.rag.engines import open_engine

    _quiet_transformers()
    with _one_error_line(), console.status(f"loading {model or 'the store model'}"):
        return open_engine(
            catalog,
            model,
            device,
            template,
            ingest,
            dtype,
            kv_url,
            max_disk_bytes,
            cache_format,
            chunk_tokens,
            chunk_overlap,
            options,
        )


def store_kv(catalog: Catalog):
    """The KV cache store of an open catalog, in the cache dtype it was built with."""
    from turborag.rag.engines import store_kv as kv_of

    with _one_error_line():
        return kv_of(catalog)
