"""Text utilities the generators share: whether a passage mentions an answer, and where sentences end.

synth.py, realtext.py and prose.py all draw distractor passages that must not state an accepted answer (else a
question would have two answering passages); `needles` prepares the strings once and `mentions` checks a
passage against them.  `SENTENCE_END` splits stdlib documentation into sentences (realtext.py's passages,
prose.py's questions).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from turborag.eval.metrics import normalize_answer

# A sentence ends at . ! or ? followed by space and something that starts a sentence.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9`'\"(\[])")


def needles(strings: Sequence[str]) -> list[tuple[str, str]]:
    """Prepare strings for `mentions`: raw lower-case and space-padded normalised form (empty if none)."""
    out = []
    for string in strings:
        normalized = normalize_answer(string)
        out.append((string.lower(), f" {normalized} " if normalized else ""))
    return out


def mentions(text: str, needles: Sequence[tuple[str, str]]) -> bool:
    """True if the text contains any needle, raw (case-insensitive) or as normalised whole words.

    Both checks are needed: the raw one catches "1987" inside "19870", the normalised one catches
    "The Velmora Letters" written as "a Velmora Letters".
    """
    lowered = text.lower()
    padded = f" {normalize_answer(text)} "
    return any(raw in lowered or (norm and norm in padded) for raw, norm in needles)
