"""`turborag serve`: the OpenAI-compatible HTTP server over a store (the work is in turborag/serve/)."""

from __future__ import annotations

from pathlib import Path

import typer

from turborag.cli.common import DeviceOpt, StoreDtypeOpt, console
from turborag.cli.loading import default_store, engine_for, load_engine, open_catalog
from turborag.core.model import DEFAULT_MODEL


def serve(
    store: Path = typer.Option(
        None,
        "--store",
        help="store to retrieve from (default: $TURBORAG_HOME/store "
        "if it exists; without one, chat answers without retrieval)",
    ),
    model: str = typer.Option(None, "--model", help="model (default: the store's model, else gemma-3-270m)"),
    host: str = typer.Option("127.0.0.1", help="bind address (localhost unless told otherwise)"),
    port: int = typer.Option(8000, min=1, max=65535),
    api_key: str = typer.Option(None, envvar="TURBORAG_API_KEY", help="require 'Authorization: Bearer KEY'"),
    device: str = DeviceOpt,
    dtype: str = StoreDtypeOpt,
    max_queue: int = typer.Option(64, min=1, help="requests waiting for the model before 503"),
    max_tokens: int = typer.Option(64, min=1, help="default max_tokens of a request"),
) -> None:
    """OpenAI-compatible HTTP server: /v1/chat/completions (retrieval + turbo), /v1/completions, documents."""
    import uvicorn

    from turborag.serve import create_app

    backend = serve_backend(store, model, device, max_tokens, dtype=dtype)
    app = create_app(backend, api_key=api_key, max_queue=max_queue)
    where = f"store {backend.documents.root}" if backend.documents else "no store (no retrieval)"
    console.print(f"serving {backend.model_name} on http://{host}:{port}/v1 with {where}")
    uvicorn.run(app, host=host, port=port, log_level="warning")


def serve_backend(
    store: Path | None,
    model: str | None,
    device: str,
    max_tokens: int,
    use_store: bool = True,
    dtype: str | None = None,
):
    """What the server serves: the store's engine with retrieval and documents, or a bare engine."""
    from turborag.serve import Backend
    from turborag.serve.store_backend import StoreBackend

    root = store or default_store()
    if not use_store or (store is None and not (root / "catalog.sqlite").exists()):
        engine = engine_for(model or DEFAULT_MODEL, device, None, "auto", dtype or "auto")
        return Backend(engine, engine.lm.name, default_max_tokens=max_tokens)
    catalog = open_catalog(root, create=False)
    engine = load_engine(catalog, model, device, None, dtype=dtype)  # refuses another model or dtype
    catalog.close()
    docs = StoreBackend(root, engine)
    return Backend(
        engine,
        Path(engine.lm.name).name if "/" in engine.lm.name else engine.lm.name,
        retriever=docs,
        documents=docs,
        default_max_tokens=max_tokens,
    )
