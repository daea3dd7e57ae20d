"""`turborag demo`: the main user job in one command. Ingest a small bundled corpus of real text, then ask a
few questions in `full` and `turbo` mode and show answers, TTFT and speedup side by side.

The corpus (`turborag/data/corpus/`) is 26 sections of the Python 3.11 language reference (PSF license, see
LICENSE there). Ingest is the offline step: the first run computes the chunk caches (about a minute on a
laptop CPU), later runs find the files unchanged and compute nothing. Each question is then retrieved once
(top-k) and answered from the same passages in both modes. The default model (Gemma 3 270M, base) is small,
so the questions are ones whose answer sits verbatim in one passage.

`demo_examples()` keeps the older fictional-fact examples (`data/demo.jsonl`) for tests and experiments.
"""

from __future__ import annotations

import json
import shutil
from importlib.resources import files
from pathlib import Path

from rich.console import Console
from rich.table import Table

from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams

QUESTIONS = [
    "What does the break statement do?",
    "How is a right shift by n bits defined?",
    "What does an imaginary literal yield?",
    "Is there a limit for the length of integer literals?",
]
TOP_K = 3


def demo_examples() -> list[dict]:
    text = files("turborag").joinpath("data/demo.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def corpus_files() -> list[Path]:
    folder = Path(str(files("turborag").joinpath("data/corpus")))
    return sorted(folder.glob("*.md"))


def run_demo(
    engine: Engine,
    console: Console,
    questions: list[str] | None = None,
    top_k: int = TOP_K,
    corpus: list[Path] | None = None,
    remake_stale: bool = False,
) -> list[dict]:
    from turborag.rag import answer as rag
    from turborag.rag.chunker import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, Chunker
    from turborag.rag.embed import Embedder
    from turborag.rag.ingest import Ingestor
    from turborag.rag.retrieve import Retriever

    questions = questions or QUESTIONS
    catalog = _demo_catalog(engine, console, remake_stale)
    embedder = Embedder()
    chunker = Chunker(engine.lm.tokenizer, DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP)
    with console.status("ingesting the bundled corpus (offline step: chunk, precompute caches, embed)"):
        res = Ingestor(engine, catalog, embedder, chunker).run(corpus or corpus_files())
    console.print(
        f"corpus: {res.documents} documents, {res.chunks} chunks; computed {res.computed_chunks} caches "
        f"({res.tokens} tokens) in {res.seconds:.1f} s"
        + (" (all unchanged)" if not res.computed_chunks else "")
    )
    retriever = Retriever(catalog, embedder)
    params = SamplingParams(max_new_tokens=48, stop_at_newline=True)  # room for a one-sentence answer
    engine.answer("warm up", ["warm up"], "full", SamplingParams(max_new_tokens=1))
    table = Table(title=f"turborag demo: {engine.lm.name} on {engine.lm.device}, top-{top_k} passages")
    for col in ("question", "passages", "full answer", "turbo answer", "full TTFT", "turbo TTFT", "speedup"):
        table.add_column(col)
    rows = []
    for q in questions:
        found = rag.find(engine, retriever.search, q, top_k, params.max_new_tokens)
        passages, texts = found.passages, found.texts
        full = engine.answer(q, texts, "full", params)
        turbo = engine.answer(q, texts, "turbo", params)
        rows.append({"question": q, "full": full, "turbo": turbo, "chunks": [p.chunk_id for p in passages]})
        table.add_row(
            q,
            ", ".join(Path(p.path).stem for p in passages),
            full.text,
            turbo.text,
            f"{full.ttft_s * 1000:.0f} ms",
            f"{turbo.ttft_s * 1000:.0f} ms",
            f"{full.ttft_s / turbo.ttft_s:.1f}x",
        )
    console.print(table)
    tokens = sum(r["full"].prompt_tokens for r in rows) / max(len(rows), 1)
    console.print(
        f"TTFT = time to first token (prompts of ~{tokens:.0f} tokens), including reading and assembling the "
        'cached chunks in turbo mode. Try your own files: `turborag ingest DIR` then `turborag ask "..."`.'
    )
    return rows


def _demo_catalog(engine: Engine, console: Console, remake_stale: bool):
    """The demo's store, bound to this engine's model and settings. A store made by an earlier demo with
    another model or dtype is made anew when `remake_stale` (our own scratch store), else refused."""
    from turborag.rag.chunker import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP
    from turborag.rag.embed import EMBEDDER
    from turborag.rag.ingest import check_keys
    from turborag.store.catalog import Catalog, StoreError
    from turborag.store.settings import StoreSettings

    settings = StoreSettings(
        model=engine.lm.name,
        model_fingerprint=engine.lm.fingerprint,
        template=engine.layout.template,
        cache_format=engine.store.cache_format,
        dtype=str(engine.lm.dtype).removeprefix("torch."),
        embedder=EMBEDDER,
        chunk_tokens=DEFAULT_CHUNK_TOKENS,
        chunk_overlap=DEFAULT_OVERLAP,
    )
    catalog = None
    try:
        catalog = Catalog(engine.store.root, create=True)
        catalog.bind(settings)
        check_keys(catalog, engine)
    except StoreError as e:
        if catalog is not None:
            catalog.close()
        if not remake_stale:
            console.print(f"error: {e}")
            raise SystemExit(2) from e
        # Our own scratch store, made by an earlier demo with another model or dtype: make it anew.
        console.print("the demo store was made with another model, dtype or turborag version; making it anew")
        shutil.rmtree(engine.store.root)
        catalog = Catalog(engine.store.root, create=True)
        catalog.bind(settings)
    return catalog
