"""Document text -> chunks of about `size` tokens of the *serving* model's tokenizer.

Sizes are counted in the serving model's tokens because that is what a chunk costs: its KV cache is
`tokens x bytes_per_token` on disk and its prefill time grows with it. (The embedding model reads at most
256 word pieces; on CPython's docs 31% of 256-token chunks are longer, and retrieval sees their first part.)

How a text is cut:
1. Split it into spans at the strongest boundary that makes every span fit: paragraphs (blank lines), then
   lines, then sentences, then words; only a single word longer than `size` is cut inside (by token offsets).
2. Pack consecutive spans greedily. When the next span does not fit, the chunk ends at the strongest boundary
   in its second half (a paragraph end beats a sentence end), so chunks prefer to end where a paragraph does.
3. The next chunk starts `overlap` tokens back (rounded to whole spans, so overlaps are whole sentences).

A chunk's text is a slice of the document (original whitespace kept); its id is `doc_id#ordinal:hash12`,
stable for the same text and parameters. The defaults (256 tokens, 32 overlap) were measured
(`turborag_research/experiments/measure_chunking.py`, docs/USING.md, "Chunk size").
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

DEFAULT_CHUNK_TOKENS = 256
DEFAULT_OVERLAP = 32

# Boundary strength of the text *after* a span: 3 paragraph, 2 line, 1 sentence, 0 word, -1 inside a word.
_LEVELS = [
    (3, re.compile(r"\n[ \t]*\n\s*")),
    (2, re.compile(r"\n\s*")),
    (1, re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+")),
    (0, re.compile(r"\s+")),
]


@dataclass
class Chunk:
    chunk_id: str
    ordinal: int
    text: str
    tokens: int  # in the serving model's tokenizer, the text alone (not the "Passage: " wrapping)
    hash: str  # sha256 of the text


@dataclass
class _Span:
    start: int
    end: int
    tokens: int
    strength: int  # of the boundary after this span


def chunking(recorded_size: int | None, recorded_overlap: int | None, size: int | None = None,
             overlap: int | None = None) -> tuple[int, int]:  # fmt: skip
    """(size, overlap) of a store's chunks: as asked, else as the store recorded, else the defaults (an
    overlap of at most half the size)."""
    size = size or recorded_size or DEFAULT_CHUNK_TOKENS
    if overlap is None:
        overlap = recorded_overlap if recorded_overlap is not None else min(DEFAULT_OVERLAP, size // 2)
    return size, overlap


def check_params(size: int, overlap: int) -> None:
    if size < 8:
        raise ValueError(f"chunk size must be at least 8 tokens, got {size}")
    if not 0 <= overlap <= size // 2:
        raise ValueError(f"overlap must be between 0 and half the chunk size ({size // 2}), got {overlap}")


class Chunker:
    def __init__(self, tokenizer, size: int = DEFAULT_CHUNK_TOKENS, overlap: int = DEFAULT_OVERLAP):
        check_params(size, overlap)
        self.tokenizer = tokenizer
        self.size = size
        self.overlap = overlap

    def count(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        enc = self.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
        return [len(ids) for ids in enc]

    def chunk(self, doc_id: str, text: str) -> list[Chunk]:
        spans = self._spans(text)
        out: list[Chunk] = []
        i = 0
        while i < len(spans):
            j = self._pack(spans, i)
            body = text[spans[i].start : spans[j - 1].end]
            tokens = self.count([body])[0]
            while tokens > self.size and j - i > 1:  # token counts are not exactly additive: re-check
                j -= 1
                body = text[spans[i].start : spans[j - 1].end]
                tokens = self.count([body])[0]
            digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
            out.append(Chunk(f"{doc_id}#{len(out)}:{digest[:12]}", len(out), body, tokens, digest))
            if j >= len(spans):
                break
            i = self._next_start(spans, i, j)
        return out

    # -- packing ---------------------------------------------------------------------------------------

    def _pack(self, spans: list[_Span], i: int) -> int:
        """End (exclusive) of the chunk starting at span i."""
        total, j = 0, i
        while j < len(spans) and (j == i or total + spans[j].tokens <= self.size):
            total += spans[j].tokens
            j += 1
        if j == len(spans):
            return j
        # Overflow: end at the strongest boundary that keeps the chunk at least half full.
        best, best_strength, acc = j, spans[j - 1].strength, 0
        for m in range(i, j):
            acc += spans[m].tokens
            if acc >= self.size // 2 and spans[m].strength > best_strength:
                best, best_strength = m + 1, spans[m].strength
        return best

    def _next_start(self, spans: list[_Span], i: int, j: int) -> int:
        """First span of the next chunk: back from j while the overlap stays within `overlap` tokens."""
        start, acc = j, 0
        while start - 1 > i and acc + spans[start - 1].tokens <= self.overlap:
            start -= 1
            acc += spans[start].tokens
        return start

    # -- splitting -------------------------------------------------------------------------------------

    def _spans(self, text: str) -> list[_Span]:
        stripped = text.strip()
        if not stripped:
            return []
        start = text.index(stripped[0])
        return self._split(text, start, start + len(stripped), 0, 3)

    def _split(self, text: str, start: int, end: int, level: int, strength: int) -> list[_Span]:
        """Spans covering text[start:end] (trailing separators excluded), each within `size` tokens."""
        (n,) = self.count([text[start:end]])
        if n <= self.size:
            return [_Span(start, end, n, strength)]
        if level == len(_LEVELS):
            return self._hard_split(text, start, end, strength)
        level_strength, pattern = _LEVELS[level]
        pieces: list[tuple[int, int, int]] = []  # (start, end, strength after)
        pos = start
        for m in pattern.finditer(text, start, end):
            if m.start() > pos:
                pieces.append((pos, m.start(), level_strength))
            pos = m.end()
        if pos < end:
            pieces.append((pos, end, strength))
        if len(pieces) == 1:
            return self._split(text, start, end, level + 1, strength)
        pieces[-1] = (pieces[-1][0], pieces[-1][1], strength)
        out: list[_Span] = []
        for s, e, st in pieces:
            out.extend(self._split(text, s, e, level + 1, st))
        return out

    def _hard_split(self, text: str, start: int, end: int, strength: int) -> list[_Span]:
        """A run without any whitespace longer than `size` tokens: cut at token offsets."""
        enc = self.tokenizer(
            text[start:end], add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        offsets = enc["offset_mapping"]
        out = []
        for s in range(0, len(offsets), self.size):
            a = start + offsets[s][0]
            b = start + offsets[min(s + self.size, len(offsets)) - 1][1]
            if b > a:
                out.append(_Span(a, b, min(self.size, len(offsets) - s), -1))
        if out:
            out[-1].strength = strength
        return out
