"""turborag: RAG answers that start fast, from precomputed chunk KV caches (TurboRAG).

The package is layered along the data flow, lowest first; each layer imports only from the ones before it
(`tests/test_layers.py` checks this):

    store  chunk K/V caches and the catalog          (ChunkKV, KVStore, Catalog)
    core   the mechanism: model, prompt, kv, engine  (load_model, Engine, SamplingParams)
    rag    files -> chunks -> embeddings -> answers  (Ingestor, Chunker, Embedder, Retriever)
    eval   accuracy and TTFT of every mode
    train  the cache-aware fine-tune and its data
    serve  the OpenAI-compatible HTTP server
    bench  measured comparisons, and the demo
    cli    the `turborag` command

The names a script needs are importable from here. They are loaded on first use (PEP 562), so
`import turborag` stays cheap and importing one layer never drags in the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_PUBLIC = {
    "ChunkKV": "turborag.store.chunk_kv",
    "KVStore": "turborag.store.kv_store",
    "Catalog": "turborag.store.catalog",
    "load_model": "turborag.core.model",
    "Engine": "turborag.core.engine",
    "EngineOptions": "turborag.core.options",
    "Answer": "turborag.core.engine",
    "MODES": "turborag.core.modes",
    "SamplingParams": "turborag.core.generate",
    "Chunker": "turborag.rag.chunker",
    "Embedder": "turborag.rag.embed",
    "Ingestor": "turborag.rag.ingest",
    "Retriever": "turborag.rag.retrieve",
    "open": "turborag.rag.engines",
    "scratch_engine": "turborag.rag.engines",
}

__all__ = [
    "MODES",
    "Answer",
    "Catalog",
    "ChunkKV",
    "Chunker",
    "Embedder",
    "Engine",
    "EngineOptions",
    "Ingestor",
    "KVStore",
    "Retriever",
    "SamplingParams",
    "load_model",
    "open",
    "scratch_engine",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'turborag' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from turborag.core.engine import Answer, Engine
    from turborag.core.generate import SamplingParams
    from turborag.core.model import load_model
    from turborag.core.modes import MODES
    from turborag.core.options import EngineOptions
    from turborag.rag.chunker import Chunker
    from turborag.rag.embed import Embedder
    from turborag.rag.ingest import Ingestor
    from turborag.rag.retrieve import Retriever
    from turborag.store.catalog import Catalog
    from turborag.store.chunk_kv import ChunkKV
    from turborag.store.kv_store import KVStore
