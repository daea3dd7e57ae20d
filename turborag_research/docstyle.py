"""Real-text records rewritten to read like documentation files, not like one-line docstring dumps.

realtext.py's passages are a signature on one line and a whitespace-normalised docstring on the next, and its
questions name the entity in backticks.  A model trained only on that shape learns that shape as the cue for
answering: the second fine-tune answered 70% of held-out stdlib questions, yet replied "The passages do not
say." to every `turborag demo` question, whose passages are chunks of Markdown files with a title, short
paragraphs and lines hard-wrapped at 70 columns, and whose questions are plain English.

`as_document` re-renders one record's passages the way `turborag ingest` sees a documentation page: a
title line (Markdown `#` or an underlined reST-style heading), the signature as an indented block, the prose
in paragraphs of two or three sentences wrapped at 70 columns.  It changes presentation only: every sentence
is kept, and the target stays one line, so the model learns to answer in one unwrapped sentence from
wrapped text.  Answerable and unanswerable records are rendered alike, so the layout says nothing about
whether the passages answer the question; only their content does.  `plain_question` drops the backticks
from a question ("What does cmath.phase do?").
"""

from __future__ import annotations

import random
import re
import textwrap

# Where a paragraph may break (layout only: no word changes). Narrower than realtext's sentence splitter
# (no break before a digit or "["); kept so that the documented `data mix --seed 2` rebuilds exactly.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(])")
WIDTH = 70


def _title(header: str) -> str:
    """`class a.B(x=1)` -> `a.B`: the name a documentation page would carry as its title."""
    return header.removeprefix("class ").split("(", 1)[0].strip()


def render_passage(passage: str, rng: random.Random) -> str:
    """One realtext passage ("signature\\nprose") as a documentation page chunk; the prose unchanged but
    for line breaks (wrapped at WIDTH, paragraphs of 2-3 sentences)."""
    header, _, body = passage.partition("\n")
    sentences = _SENTENCE_END.split(body.strip())
    paragraphs, i = [], 0
    while i < len(sentences):
        n = rng.choice((2, 3))
        paragraphs.append(textwrap.fill(" ".join(sentences[i : i + n]), WIDTH))
        i += n
    title = _title(header)
    if rng.random() < 0.5:
        heading = f"# {title}"
    else:
        heading = f"{title}\n{rng.choice('*=-') * len(title)}"
    return f"{heading}\n\n   {header}\n\n" + "\n\n".join(paragraphs)


def plain_question(question: str) -> str:
    """The question without backticks, as a person would type it."""
    return question.replace("`", "")


def as_document(record: dict, rng: random.Random) -> dict:
    """A realtext record with every passage rendered as a documentation chunk and, half the time, a plain
    question; answers, answer_index and the rest unchanged, plus "style": "document"."""
    question = plain_question(record["question"]) if rng.random() < 0.5 else record["question"]
    contexts = [render_passage(p, rng) for p in record["contexts"]]
    return {**record, "question": question, "contexts": contexts, "style": "document"}
