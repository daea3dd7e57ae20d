"""One RAG answer, the same way everywhere: retrieve -> fit the passages to the context window -> begin.

The server, `turborag ask`, the demo and the benches all answer a question from a store through here, so
they read the same passages for the same question: the top-k chunks, best first, less the lowest-ranked ones
that would not fit the model's context window with the question and the answer budget (fit_passages). The
engine then answers in the mode asked for; `full` and the turbo modes differ only in cache reuse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.rag.retrieve import Passage, fit_passages

# How passages are found, (question, k) -> best first: `Retriever.search`, or a server's in one collection.
Search = Callable[[str, int], list[Passage]]


@dataclass
class Found:
    """The passages a question is answered from, best first, and how many retrieved ones did not fit."""

    passages: list[Passage]
    dropped: int

    @property
    def texts(self) -> list[str]:
        return [p.text for p in self.passages]


def find(engine: Engine, search: Search, question: str, top_k: int, max_new_tokens: int) -> Found:
    """The top-k chunks for `question` that fit the context window with it and `max_new_tokens`. Raises
    PromptTooLong when the question does not fit even alone."""
    kept, dropped = fit_passages(engine, question, search(question, top_k), max_new_tokens)
    return Found(kept, dropped)


def begin_steps(
    engine: Engine,
    search: Search,
    question: str,
    mode: str,
    params: SamplingParams,
    top_k: int,
    on_found: Callable[[Found], None] | None = None,
    step: int | None = None,
    defer: bool = False,
    collection: str | None = None,
):
    """`Engine.begin_steps` over the passages found for `question` (see there for `step`, `defer` and
    `collection`). `on_found` sees them before the first forward, so a caller can name them in its
    response."""
    found = find(engine, search, question, top_k, params.max_new_tokens)
    if on_found is not None:
        on_found(found)
    steps = engine.begin_steps(question, found.texts, mode, params, step, defer, collection=collection)
    return (yield from steps)
