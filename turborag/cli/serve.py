"""`turborag serve`: the OpenAI-compatible HTTP server over a store (the work is in turborag/serve/)."""

from __future__ import annotations

import logging
import signal
import sys
from dataclasses import replace
from pathlib import Path

import typer

from turborag.cli.common import (
    AbstainThresholdOpt,
    DecodeWeightsOpt,
    DeviceOpt,
    NameCheckOpt,
    StoreDtypeOpt,
    answer_options,
    console,
    fail,
    parse_bytes,
    plural,
)
from turborag.cli.loading import default_store, engine_for, load_engine, open_catalog
from turborag.cli.remote import local_url, remove_server_file, write_server_file
from turborag.core.defaults import DEFAULT_MAX_BATCH, DEFAULT_MODEL, DEFAULT_PREFILL_BUDGET
from turborag.core.options import EngineOptions

log = logging.getLogger("turborag.serve")


def serve(
    store: Path = typer.Option(
        None,
        "--store",
        help="store to retrieve from (default: $TURBORAG_HOME/store "
        "if it exists; without one, chat answers without retrieval)",
    ),
    model: str = typer.Option(
        None, "--model", help=f"model (default: the store's model, else {DEFAULT_MODEL})"
    ),
    host: str = typer.Option("127.0.0.1", help="bind address (localhost unless told otherwise)"),
    port: int = typer.Option(8000, min=1, max=65535),
    allowed_host: list[str] = typer.Option(
        None,
        "--allowed-host",
        help="also answer requests for this Host name (NAME or NAME:PORT; repeatable; '*': any, behind a "
        "proxy that checks it); other Hosts than the bind address get 421 (DNS rebinding)",
    ),
    api_key: str = typer.Option(
        None, envvar="TURBORAG_API_KEY", help="require 'Authorization: Bearer KEY' (a key allowed everything)"
    ),
    keys: Path = typer.Option(
        None,
        "--keys",
        help="keys file of `turborag keys add` (hashed keys, each scoped to collections it may read/write)",
    ),
    metrics_key: str = typer.Option(
        None, "--metrics-key", envvar="TURBORAG_METRICS_KEY", help="require 'Bearer KEY' on /metrics"
    ),
    device: str = DeviceOpt,
    dtype: str = StoreDtypeOpt,
    max_queue: int = typer.Option(64, min=1, help="requests waiting for the model before 503"),
    max_tokens: int = typer.Option(64, min=1, help="default max_tokens of a request"),
    ram_cache_bytes: str = typer.Option(
        "1G", "--ram-cache-bytes", help="RAM tier: decoded chunk caches held in memory, LRU (e.g. 2G; 0: off)"
    ),
    max_batch: int = typer.Option(
        DEFAULT_MAX_BATCH,
        min=1,
        help="requests run together, prefilling or decoding (continuous batching; 1: one at a time); more "
        "wait in the queue",
    ),
    prefill_budget: int = typer.Option(
        DEFAULT_PREFILL_BUDGET,
        "--max-batch-tokens",
        "--prefill-budget",
        min=1,
        help="prompt tokens prefilled between two decode steps, padding of batched prefills counted (how "
        "long new requests may stall the running ones)",
    ),
    max_question_tokens: int = typer.Option(
        1024, min=1, help="a question's tokens at most (longer: 400, before any model work)"
    ),
    max_prompt_tokens: int = typer.Option(
        8192,
        min=1,
        help="a prompt's tokens at most: a completion's, a plain chat's, a question with its contexts (400)",
    ),
    max_uploads_per_key: int = typer.Option(
        2, min=1, help="document uploads one key may have in progress at once (more: 429, Retry-After)"
    ),
    max_cache_bytes_per_key: str = typer.Option(
        "1G",
        "--max-cache-bytes-per-key",
        help="chunk caches a key that may write a collection may add to the store with its own passages "
        "(turborag.contexts), counted across restarts (beyond: 429; e.g. 500M; 0: no quota); a key that may "
        "not write gets them computed in RAM, never stored",
    ),
    read_only: bool = typer.Option(
        False,
        "--read-only",
        help="a replica: open the store's catalog read-only (SQLite mode=ro); uploads and deletes get 403, "
        "new ingests by another process are still picked up",
    ),
    abstain_threshold: float = AbstainThresholdOpt,
    name_check: bool = NameCheckOpt,
    decode_weights: str = DecodeWeightsOpt,
) -> None:
    """OpenAI-compatible HTTP server: /v1/chat/completions (retrieval + turbo), /v1/completions, documents."""
    ram = _size("--ram-cache-bytes", ram_cache_bytes)
    quota = _size("--max-cache-bytes-per-key", max_cache_bytes_per_key) or None
    if keys is not None and not keys.expanduser().is_file():
        fail(f"--keys {keys}: no such file (make one with `turborag keys add NAME --keys {keys}`)")
    if read_only and store is None and not (default_store() / "catalog.sqlite").exists():
        fail("--read-only serves a store: pass --store DIR (one that `turborag ingest` made)")
    if store is not None:  # a missing or foreign --store is one line, before the server's imports
        open_catalog(store, create=False, read_only=read_only).close()
    # the server (FastAPI, and torch through the engine it serves): imported once the arguments are known good
    from turborag.serve import create_app
    from turborag.serve.access import Access, KeysError
    from turborag.serve.app import run_app
    from turborag.serve.origin import HostPolicy

    try:
        hosts = HostPolicy.for_bind(host, port, allowed_host or [])
    except ValueError as e:
        fail(f"--allowed-host: {e}")
    for warning in (hosts.warning(), open_metrics_warning(bool(api_key or keys), metrics_key)):
        if warning:
            log.warning(warning)
    try:
        access = Access.from_file(keys.expanduser() if keys else None)
    except KeysError as e:
        fail(f"--keys: {e}")
    options = replace(answer_options(abstain_threshold, name_check, decode_weights), ram_cache_bytes=ram)
    served = served_for(store, model, device, max_tokens, dtype=dtype, options=options, read_only=read_only)
    app = create_app(
        served,
        api_key=api_key,
        max_queue=max_queue,
        max_batch=max_batch,
        prefill_budget=prefill_budget,
        access=access,
        metrics_key=metrics_key,
        hosts=hosts,
        max_question_tokens=max_question_tokens,
        max_prompt_tokens=max_prompt_tokens,
        max_uploads_per_key=max_uploads_per_key,
        max_cache_bytes_per_key=quota,
    )
    _print_start(served, host, port, quota)
    if served.documents is None:
        run_app(app, host, port)
        return
    # `turborag ask` on this store finds the server through this file and asks it instead of loading a model.
    # uvicorn re-raises SIGTERM after its graceful shutdown; exiting through SystemExit lets `finally` run.
    # The file goes as soon as the signal comes (`on_exit`): a stopping server takes no new question.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    root = served.documents.root
    write_server_file(root, local_url(host, port), served.model_name, bool(api_key or keys))
    try:
        run_app(app, host, port, on_exit=lambda: remove_server_file(root))
    finally:
        remove_server_file(root)


def _size(option: str, text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:
        fail(f"{option}: {e}")


def open_metrics_warning(keyed: bool, metrics_key: str | None) -> str | None:
    """The warning for a server whose API needs a key while /metrics does not."""
    if keyed and not metrics_key:
        return (
            "/metrics answers without a key (request counts, queue depth, token rates): set --metrics-key "
            "(or TURBORAG_METRICS_KEY) to require one"
        )
    return None


def _print_start(served, host: str, port: int, quota: int | None) -> None:
    """Where the server listens, what it serves, what it may write, and how it answers by default."""
    where = f"store {served.documents.root}" if served.documents else "no store (no retrieval)"
    console.print(f"serving {served.model_name} on http://{host}:{port}/v1 with {where}")
    if served.documents is not None and not served.documents.read_only:
        from turborag.store.disk_tier import cap_note

        console.print(f"note: {cap_note(served.engine.store.backend)}")
        per_key = f"at most {quota / 1e9:.2f} GB each" if quota else "no quota (--max-cache-bytes-per-key)"
        console.print(f"note: caches of requests' own passages are stored for keys that may write, {per_key}")
        if served.engine.isolate_collections:
            console.print("note: chunk caches are keyed per collection (the store's --isolate-collections)")
    if (threshold := served.engine.abstain_threshold) is not None:
        console.print(f'note: answers "The passages do not say." when the model gives it p >= {threshold}')
    if served.engine.name_check:
        console.print(
            'note: answers "The passages do not say." when no passage mentions a name the question asks about'
        )
    if notice := served.engine.auto_notice():
        console.print(f"note: {notice} (requests that leave `turborag.mode` out get `auto`)")


def served_for(
    store: Path | None,
    model: str | None,
    device: str,
    max_tokens: int,
    use_store: bool = True,
    dtype: str | None = None,
    options: EngineOptions | None = None,
    read_only: bool = False,
):
    """What the server serves: the store's engine with retrieval and documents, or a bare engine (no RAM
    tier: it has no store); with `read_only`, a replica that only reads the catalog."""
    options = options or EngineOptions()
    from turborag.serve import Served
    from turborag.serve.served_store import ServedStore
    from turborag.store.disk_tier import default_cap

    root = store or default_store()
    if not use_store or (store is None and not (root / "catalog.sqlite").exists()):
        bare = replace(options, ram_cache_bytes=0)
        engine = engine_for(model or DEFAULT_MODEL, device, None, "auto", dtype or "auto", options=bare)
        return Served(engine, engine.lm.name, default_max_tokens=max_tokens)
    catalog = open_catalog(root, create=False, read_only=read_only)
    recorded = catalog.settings()
    # a store that recorded no cap gets one while served: requests may add caches (uploads, own passages)
    cap = None
    if not read_only and recorded.max_disk_bytes is None and recorded.kv_url is None:
        cap = default_cap(root)
    # refuses another model or dtype
    engine = load_engine(catalog, model, device, None, dtype=dtype, options=options, max_disk_bytes=cap)
    catalog.close()
    docs = ServedStore(root, engine, read_only=read_only)
    if not read_only:
        recovered = docs.recover_uploads()
        if recovered.uploads:
            log.warning(
                "rolled back %s a crash interrupted (%s removed, %.1f MB freed)",
                plural(recovered.uploads, "upload"),
                plural(recovered.files, "file"),
                recovered.bytes / 1e6,
            )
    return Served(
        engine,
        Path(engine.lm.name).name if "/" in engine.lm.name else engine.lm.name,
        retriever=docs,
        documents=docs,
        default_max_tokens=max_tokens,
    )
