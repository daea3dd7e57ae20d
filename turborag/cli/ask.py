"""`turborag ask`: retrieve top-k chunks from the store and answer, streamed, with TTFT on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from turborag.cli.common import (
    AbstainThresholdOpt,
    CollectionOpt,
    DecodeWeightsOpt,
    DeviceOpt,
    JsonOpt,
    NameCheckOpt,
    StoreDtypeOpt,
    StoreModelOpt,
    StoreOpt,
    StoreTemplateOpt,
    answer_options,
    fail,
)
from turborag.cli.loading import default_store, load_engine, open_catalog
from turborag.cli.remote import ServerBusy, ServerError, ServerUnreachable, ask_server, find_server
from turborag.core.modes import MODES


def ask(
    question: str = typer.Argument(..., help="the question"),
    store: Path = StoreOpt,
    collection: str = CollectionOpt,
    mode: str = typer.Option(
        "auto",
        help=f"one of {', '.join(MODES)}; auto = turbo on a cache-aware fine-tune (the default model), "
        "else turbo-blend",
    ),
    top_k: int = typer.Option(5, "--top-k", min=1, help="passages to retrieve"),
    max_new_tokens: int = typer.Option(64, min=1),
    model: str = StoreModelOpt,
    device: str = DeviceOpt,
    template: str = StoreTemplateOpt,
    dtype: str = StoreDtypeOpt,
    server: str = typer.Option(
        None,
        "--server",
        help="answer through this running `turborag serve` (URL); default: the server "
        "running on --store, if there is one",
    ),
    local: bool = typer.Option(False, "--local", help="load the model here even if a server is running"),
    timeout: float = typer.Option(
        None,
        "--timeout",
        min=0,
        help="a busy server: give up (exit 1) if its answer has not started after this many seconds; "
        "default: wait, with a progress line now and then",
    ),
    api_key: str = typer.Option(None, envvar="TURBORAG_API_KEY", help="the server's API key, if it has one"),
    abstain_threshold: float = AbstainThresholdOpt,
    name_check: bool = NameCheckOpt,
    decode_weights: str = DecodeWeightsOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Answer from the store: retrieve top-k chunks, reuse their caches (turbo) or prefill them (full).
    Through a running `turborag serve` of the same store when there is one (no model load here)."""
    if mode not in MODES:
        fail(f"unknown mode {mode}: use one of {', '.join(MODES)}")
    if not question.strip():
        fail("the question is empty")
    # Asking for a particular model, dtype, template, device or answer policy means this process's own engine.
    policy = abstain_threshold is not None or name_check is not None
    own_engine = bool(model or template or dtype or device != "cpu" or policy)
    if server and policy:
        fail(
            "--abstain-threshold and --name-check: the answer policy needs a local engine; a server answers "
            "with its own (`turborag serve --abstain-threshold ... --name-check`)"
        )
    url = server or (None if local or own_engine else find_server(store or default_store()))
    if url:
        try:
            return _ask_remote(
                url, question, mode, top_k, max_new_tokens, api_key, as_json, collection, timeout
            )
        except ServerUnreachable as e:  # nothing took the connection: there is no server to wait for
            if server:
                fail(str(e))
            typer.echo(f"warning: {e}; answering here", err=True)
        except ServerBusy as e:  # never answered here as well: that would compute the answer twice
            fail(str(e), code=1)
        except ServerError as e:
            fail(str(e))
    catalog = open_catalog(store, create=False, collection=collection)
    options = answer_options(abstain_threshold, name_check, decode_weights)
    engine = load_engine(catalog, model, device, template, dtype=dtype, options=options)
    _ask_local(engine, catalog, question, collection, mode, top_k, max_new_tokens, as_json)


def _ask_remote(url, question, mode, top_k, max_new_tokens, api_key, as_json, collection, timeout) -> None:
    """The answer through the server at `url`; while a busy server has not started it, a line on stderr
    now and then says that `ask` is waiting (and is not stuck)."""
    answer = None
    stream = ask_server(url, question, mode, top_k, max_new_tokens, api_key, collection, timeout, _stderr)
    for item in stream:
        if not isinstance(item, str):
            answer = item
        elif not as_json:
            sys.stdout.write(item)
            sys.stdout.flush()
    _report(answer, answer.mode or mode, answer.chunks, as_json, via=url)


def _stderr(line: str) -> None:
    typer.echo(line, err=True)


def _ask_local(engine, catalog, question, collection, mode, top_k, max_new_tokens, as_json) -> None:
    from turborag.core.engine import Answer, PromptTooLong
    from turborag.rag import answer as rag
    from turborag.rag.embed import Embedder
    from turborag.rag.retrieve import Retriever

    retriever = Retriever(catalog, Embedder())
    if not len(retriever):
        where = f"store {catalog.root}" + ("" if collection == "default" else f", collection {collection},")
        fail(f"{where} has no chunks: ingest some documents first")
    try:
        found = rag.find(engine, retriever.search, question, top_k, max_new_tokens)
    except PromptTooLong as e:
        fail(str(e))
    if found.dropped:
        typer.echo(
            f"warning: {found.dropped} of the top {top_k} passages do not fit the context window; "
            "answering from the rest",
            err=True,
        )
    notice = engine.auto_notice() if mode == "auto" else None
    if notice:
        typer.echo(f"note: {notice}", err=True)
    answer = None
    for item in engine.stream(question, found.texts, mode, engine.qa_params(max_new_tokens), collection):
        if isinstance(item, Answer):
            answer = item
        elif not as_json:
            sys.stdout.write(item)
            sys.stdout.flush()
    if answer.missing_names:
        names = ", ".join(answer.missing_names)
        typer.echo(f"note: declined: no passage mentions {names} (--no-name-check answers anyway)", err=True)
    if answer.computed_chunks:
        typer.echo(
            f"warning: {answer.computed_chunks} chunk caches were missing or damaged and were "
            "recomputed for this answer (`turborag cache verify` checks them all)",
            err=True,
        )
    _report(answer, answer.mode, [p.chunk_id for p in found.passages], as_json)


def _report(answer, mode: str, ids: list[str], as_json: bool, via: str | None = None) -> None:
    """The answer's numbers: one JSON object on stdout, or one line on stderr after the streamed text."""
    if as_json:
        out = {
            "answer": answer.text,
            "mode": mode,
            "ttft_s": round(answer.ttft_s, 4),
            "total_s": round(answer.total_s, 4),
            "prompt_tokens": answer.prompt_tokens,
            "cached_tokens": answer.cached_tokens,
            "chunks": ids,
        }
        if getattr(answer, "missing_names", None):  # declined by the name check
            out["missing_names"] = answer.missing_names
        typer.echo(json.dumps(out))
        return
    typer.echo("")
    typer.echo(
        f"[{mode}{f' via {via}' if via else ''}] TTFT {answer.ttft_s * 1000:.0f} ms, "
        f"total {answer.total_s:.2f} s, {answer.prompt_tokens} prompt tokens "
        f"({answer.cached_tokens} from caches); passages: " + ", ".join(_short(i) for i in ids),
        err=True,
    )


def _short(chunk_id: str) -> str:
    """`/long/path/to/file.md#3:abcdef012345` -> `file.md#3`."""
    name = chunk_id.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[0]
