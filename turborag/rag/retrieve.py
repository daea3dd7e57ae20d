"""`turborag ask`: question -> top-k chunks from the store's index -> the engine (turbo or full) -> answer.

Retrieval is the same for every mode, so `full` and `turbo` answer from exactly the same passages (in rank
order, best first; putting the best one last, next to the question, made no difference on the demo
questions) and differ only in cache reuse. Identical chunk texts (the same paragraph in two files) are
retrieved once. If the question plus k passages plus the answer budget does not fit the model's context
window, the lowest-ranked passages are dropped (and reported); a question that does not fit even alone is an
error.
"""

from __future__ import annotations

from dataclasses import dataclass

from turborag.core.engine import Engine, PromptTooLong
from turborag.rag.embed import Embedder, VectorIndex
from turborag.rag.ingest import refresh_index
from turborag.store.catalog import Catalog


@dataclass
class Passage:
    chunk_id: str
    path: str
    text: str
    score: float
    doc_id: str = ""  # the catalog's document id (a path, or path#record for JSONL)
    ordinal: int = 0  # the chunk's place in its document


class Retriever:
    def __init__(self, catalog: Catalog, embedder: Embedder, index: VectorIndex | None = None):
        self.catalog = catalog
        self.embedder = embedder
        self.index = index if index is not None else refresh_index(catalog)

    def __len__(self) -> int:
        return len(self.index)

    def search(self, question: str, k: int) -> list[Passage]:
        """The k best chunks for the question, best first, without duplicate texts."""
        (q,) = self.embedder.encode([question])  # (384,)
        hits = self.index.search(q, k * 2)  # room for duplicates
        rows = {r.rowid: r for r in self.catalog.chunks_by_rowid([h.rowid for h in hits])}
        out: list[Passage] = []
        seen: set[str] = set()
        for h in hits:
            row = rows.get(h.rowid)
            if row is None or row.cache_key in seen:
                continue
            seen.add(row.cache_key)
            out.append(Passage(row.chunk_id, row.path, row.text, h.score, row.doc_id, row.ordinal))
            if len(out) == k:
                break
        return out


def fit_passages(
    engine: Engine, question: str, passages: list[Passage], max_new_tokens: int
) -> tuple[list[Passage], int]:
    """Drop the lowest-ranked passages until the prompt fits the context window; returns (kept, dropped).
    Raises PromptTooLong if the question does not fit even without passages."""
    layout, limit = engine.layout, engine.lm.max_positions
    base = len(layout.prefix_ids()) + len(layout.suffix_ids(question)) + max_new_tokens
    if base > limit:
        raise PromptTooLong(
            f"the question is {len(layout.suffix_ids(question))} tokens; with the instruction and "
            f"{max_new_tokens} new tokens that is {base} tokens, more than the model's context window "
            f"of {limit}"
        )
    kept, used = [], base
    for p in passages:
        n = len(layout.chunk_ids(p.text))
        if used + n > limit:
            break
        kept.append(p)
        used += n
    return kept, len(passages) - len(kept)
