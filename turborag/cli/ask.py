"""`turborag ask`: retrieve top-k chunks from the store and answer, streamed, with TTFT on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from turborag.cli.common import (
    DeviceOpt,
    JsonOpt,
    StoreDtypeOpt,
    StoreModelOpt,
    StoreOpt,
    StoreTemplateOpt,
    fail,
)
from turborag.cli.loading import load_engine, open_catalog
from turborag.core.engine import MODES


def ask(
    question: str = typer.Argument(..., help="the question"),
    store: Path = StoreOpt,
    mode: str = typer.Option("turbo", help=f"one of {', '.join(MODES)}"),
    top_k: int = typer.Option(5, "--top-k", min=1, help="passages to retrieve"),
    max_new_tokens: int = typer.Option(64, min=1),
    model: str = StoreModelOpt,
    device: str = DeviceOpt,
    template: str = StoreTemplateOpt,
    dtype: str = StoreDtypeOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Answer from the store: retrieve top-k chunks, reuse their caches (turbo) or prefill them (full)."""
    from turborag.core.engine import Answer, PromptTooLong
    from turborag.core.generate import SamplingParams
    from turborag.rag.embed import Embedder
    from turborag.rag.retrieve import Retriever, fit_passages

    if mode not in MODES:
        fail(f"unknown mode {mode}: use one of {', '.join(MODES)}")
    if not question.strip():
        fail("the question is empty")
    catalog = open_catalog(store, create=False)
    engine = load_engine(catalog, model, device, template, dtype=dtype)
    retriever = Retriever(catalog, Embedder())
    if not len(retriever):
        fail(f"store {catalog.root} has no chunks: ingest some documents first")
    passages = retriever.search(question, top_k)
    try:
        passages, dropped = fit_passages(engine, question, passages, max_new_tokens)
    except PromptTooLong as e:
        fail(str(e))
    if dropped:
        typer.echo(
            f"warning: {dropped} of the top {top_k} passages do not fit the context window; "
            "answering from the rest",
            err=True,
        )
    # Base models run on after their answer ("Question: ..."): stop at the line end; chat models stop at EOS.
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_at_newline=engine.layout.template == "plain")
    answer = None
    for item in engine.stream(question, [p.text for p in passages], mode, params):
        if isinstance(item, Answer):
            answer = item
        elif not as_json:
            sys.stdout.write(item)
            sys.stdout.flush()
    if answer.computed_chunks:
        typer.echo(
            f"warning: {answer.computed_chunks} chunk caches were missing or damaged and were "
            "recomputed for this answer (`turborag cache verify` checks them all)",
            err=True,
        )
    ids = [p.chunk_id for p in passages]
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
        typer.echo(json.dumps(out))
        return
    typer.echo("")
    typer.echo(
        f"[{mode}] TTFT {answer.ttft_s * 1000:.0f} ms, total {answer.total_s:.2f} s, "
        f"{answer.prompt_tokens} prompt tokens ({answer.cached_tokens} from caches); passages: "
        + ", ".join(_short(i) for i in ids),
        err=True,
    )


def _short(chunk_id: str) -> str:
    """`/long/path/to/file.md#3:abcdef012345` -> `file.md#3`."""
    name = chunk_id.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[0]
