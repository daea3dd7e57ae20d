"""`turborag bench ask`: the user's job end to end. Ingest a corpus (throughput), then ask questions with
top-k retrieval and compare TTFT of `full` and `turbo` side by side in one run.

Default corpus: CPython's topic documentation (`pydoc_data.topics`, shipped with every Python, PSF license),
one Markdown file per topic, the first `docs` topics in name order. For each top-k, every question is
retrieved once and the same passages are answered in both modes, alternating which goes first; one new
token is generated (TTFT is what is measured). Turbo's TTFT includes reading and assembling the chunk caches;
a turbo answer that had to compute a missing cache would be unfair and stops the bench.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.rag import answer as rag
from turborag.rag.chunker import Chunker
from turborag.rag.embed import Embedder
from turborag.rag.ingest import Ingestor
from turborag.rag.retrieve import Retriever
from turborag.store.catalog import Catalog

QUESTIONS = [
    "What does the pass statement do?",
    "Which exception is raised when an assert statement fails?",
    "What does the break statement do inside a loop?",
    "What does the global statement declare?",
    "What kind of object does a lambda expression create?",
    "What does the nonlocal statement do?",
    "What does the del statement do to a name?",
    "Which special method implements the in membership test?",
    "How are augmented assignments such as x += 1 evaluated?",
    "What does the return statement do in a generator function?",
    "How is a floating point literal written?",
    "What does the import statement do?",
]


def write_corpus(out: Path, docs: int) -> Path:
    """The first `docs` CPython documentation topics as `<topic>.md` files under `out` (rewritten only if
    their text changed, so a rerun is an unchanged re-ingest)."""
    from pydoc_data.topics import topics

    out.mkdir(parents=True, exist_ok=True)
    for name in sorted(topics)[:docs]:
        path = out / f"{name}.md"
        text = f"# {name}\n\n{topics[name].strip()}\n"
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    return out


def bench_ask(
    engine: Engine,
    catalog: Catalog,
    corpus: Path,
    top_ks: list[int],
    n_questions: int = 8,
    repeats: int = 1,
    chunk_tokens: int = 256,
    overlap: int = 32,
    log: Callable[[str], None] | None = None,
) -> dict:
    log = log or (lambda msg: None)
    embedder = Embedder()
    ingest = _ingest(engine, catalog, embedder, corpus, chunk_tokens, overlap, log)
    retriever = Retriever(catalog, embedder)
    retrieval: list[float] = []

    def timed_search(question: str, k: int):
        """The search alone, timed (fitting the passages to the context is not retrieval)."""
        t = time.perf_counter()
        hits = retriever.search(question, k)
        retrieval.append(time.perf_counter() - t)
        return hits

    one = SamplingParams(max_new_tokens=1)
    engine.answer("warm up", ["A short warm-up passage."], "full", one)
    engine.answer("warm up", ["A short warm-up passage."], "turbo", one)
    rows = []
    questions = (QUESTIONS * (n_questions // len(QUESTIONS) + 1))[:n_questions]
    for k in top_ks:
        full, turbo, ctx = [], [], []
        retrieval.clear()
        for qi, q in enumerate(questions):
            texts = rag.find(engine, timed_search, q, k, 1).texts
            ctx.append(sum(len(engine.layout.chunk_ids(x)) for x in texts))
            for r in range(repeats):
                order = ("full", "turbo") if (qi + r) % 2 == 0 else ("turbo", "full")
                for mode in order:
                    a = engine.answer(q, texts, mode, one)
                    if a.computed_chunks:
                        raise RuntimeError(
                            "a chunk cache was missing at query time; the bench would be unfair"
                        )
                    (full if mode == "full" else turbo).append(a.ttft_s)
        f, tb = statistics.median(full), statistics.median(turbo)
        row = {
            "top_k": k,
            "context_tokens_mean": statistics.mean(ctx),
            "full_ttft_s": f,
            "turbo_ttft_s": tb,
            "speedup": f / tb,
            "retrieval_ms": 1000 * statistics.median(retrieval),
            "questions": len(questions),
            "repeats": repeats,
        }
        log(f"top-k {k}: full {f:.3f} s, turbo {tb:.3f} s, {f / tb:.1f}x")
        rows.append(row)
    return {
        "model": engine.lm.name,
        "device": str(engine.lm.device),
        "dtype": str(engine.lm.dtype).replace("torch.", ""),
        "chunk_tokens": chunk_tokens,
        "chunk_overlap": overlap,
        "ingest": ingest,
        "rows": rows,
    }


def _ingest(engine: Engine, catalog: Catalog, embedder: Embedder, corpus: Path, chunk_tokens: int,
            overlap: int, log: Callable[[str], None]) -> dict:  # fmt: skip
    """Ingest the corpus (the offline step, timed): its summary with chunks and tokens per second."""
    ingestor = Ingestor(engine, catalog, embedder, Chunker(engine.lm.tokenizer, chunk_tokens, overlap))
    res = ingestor.run([corpus])
    log(
        f"ingested {res.documents} documents: {res.computed_chunks} chunks, {res.tokens} tokens, "
        f"{res.seconds:.1f} s"
    )
    return {
        **res.summary(),
        "computed_chunks": res.computed_chunks,
        "tokens_per_s": res.tokens / res.seconds if res.seconds else 0.0,
        "chunks_per_s": res.computed_chunks / res.seconds if res.seconds else 0.0,
    }
