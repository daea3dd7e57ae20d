"""The name check: decline a question that names something none of its passages mention.

Why a string test beside the fine-tune: the shipped adapter's worst abstention failure (docs/BENCHMARKS.md)
is a question about an entity or an API that is not in the passages while a near-namesake is: "Ninol
Tertius" asked, "Sinol Tertius" retrieved; `collections.ChainMap.pop` asked, `collections.deque.pop`
retrieved. A 270M reader takes the look-alike's value about half the time, and five training stages did not
teach it the difference, yet whether a name occurs in the passages needs no model at all.

Only names that a user would not paraphrase are checked:
- code: spans in backticks that are identifiers (`maxsize`, `json.loads()`), and dotted names outside them
  (os.path.join);
- proper names: two or more capitalized words in a row that do not start the question ("Ninol Tertius",
  "The Tilso Protocol"). A single capitalized word is not checked: "Boolean", "Unicode" or "Windows" is as
  often an ordinary word of the question as a name, and passages paraphrase it.

A name counts as mentioned when it occurs in a passage as whole words, ignoring case and runs of spaces. A
dotted name also counts when its last two or more parts occur (documentation often writes `path.join` for
`os.path.join`). A typo in a name makes the check decline: the reply says which name it did not find.

News-style questions write names the way people do, and each of these is read as ordinary English, not as
a missing name: two names joined by "and" ("Will Smith and Chris Rock") are two names; a possessive ends a
name ("Meta's AI" names Meta, a single word, so nothing is checked); a hyphen is a word break ("Full-Self
Driving" is found as "Full Self-Driving") and a lower-case tail after it is no part of the name ("Squid
Game-inspired" checks "Squid Game"); the last word of a proper name may be singular or plural ("Academy
Award" is found as "Academy Awards"). Code names stay exact.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_CODE = re.compile(r"`([^`]+)`")
_IDENT = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_DOTTED = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?![\w.(])")
# capitalized words joined by single spaces, with "of", "the", "and" allowed between two of them
_WORD = r"[A-Z][\w'-]*"
_NAME = re.compile(rf"(?<!\w){_WORD}(?:\s+(?:(?:of|the|and)\s+)?{_WORD})+")


def question_names(question: str) -> list[str]:
    """The names in `question` that its passages must mention, in order, without repeats."""
    names: list[str] = []
    for span in _CODE.findall(question):
        span = span.strip().removesuffix("()")
        if _IDENT.fullmatch(span):
            names.append(span)
    rest = _blank(_CODE, question)  # same length as the question: positions still match
    for m in _DOTTED.finditer(rest):
        if max(len(part) for part in m.group(0).split(".")) >= 2:  # not "e.g" or "i.e"
            names.append(m.group(0))
    rest = _blank(_DOTTED, rest)
    # where a sentence starts: the question's first word, and a word after ":", ".", "?" or "!" ("Fill in
    # the blank: Crystals of X have ..."): capitalized as a sentence's first word, not as a name
    starts = {m.end() for m in re.finditer(r"^\s*|[:.?!]\s+", question)}
    for m in _NAME.finditer(rest):
        words = m.group(0).split()
        if m.start() in starts:  # "Which", "How", ...: the sentence's own first word
            words = words[1:]
        names += [" ".join(seg) for seg in _segments(words) if len(seg) >= 2]
    return list(dict.fromkeys(names))


def _segments(words: list[str]) -> list[list[str]]:
    """A run of capitalized words split into the names it holds: at "and", after a possessive, at a
    hyphen's lower-case tail (dropped); "of"/"the" kept inside a name but not at its ends."""
    out: list[list[str]] = [[]]
    for word in words:
        if word == "and":
            out.append([])
            continue
        possessive = re.search(r"['\u2019]s?$", word)
        base = word[: possessive.start()] if possessive else word
        stripped = re.sub(r"-[a-z][\w'-]*$", "", base)  # "Game-inspired" -> "Game", and the name ends
        if stripped.rstrip("'-"):
            out[-1].append(stripped.rstrip("'-"))
        if possessive or stripped != base:
            out.append([])
    trimmed = []
    for seg in out:
        while seg and seg[0][0].islower():  # "of"/"the" left in front once the first word is dropped
            seg = seg[1:]
        while seg and seg[-1][0].islower():
            seg = seg[:-1]
        trimmed.append(seg)
    return trimmed


def _blank(pattern: re.Pattern, text: str) -> str:
    """`text` with each match of `pattern` overwritten by "|": no name runs across it, lengths unchanged."""
    return pattern.sub(lambda m: "|" * len(m.group(0)), text)


def _mentions(text: str, name: str) -> bool:
    if " " not in name:  # code: exact, whole words
        return re.search(r"(?<!\w)" + re.escape(name) + r"(?!\w)", text, re.IGNORECASE) is not None
    words = [re.escape(w) for w in re.split(r"[\s\-\u2010-\u2015]+", name) if w]
    last = words[-1]
    # the last word singular or plural: "Award" finds "Awards", "Awards" finds "Award"
    stem = last[:-1] if last.lower().endswith("s") and len(last) > 3 else last
    words[-1] = f"{stem}(?:s|es)?"
    gap = r"[\s\-\u2010-\u2015]+"  # spaces, hyphens and dashes alike
    return re.search(r"(?<!\w)" + gap.join(words) + r"(?!\w)", text, re.IGNORECASE) is not None


def _mentioned(name: str, passages: Sequence[str]) -> bool:
    parts = name.split(".")
    forms = [".".join(parts[i:]) for i in range(max(1, len(parts) - 1))]  # a.b.c -> a.b.c, b.c
    return any(_mentions(p, form) for p in passages for form in forms)


def missing_names(question: str, passages: Sequence[str]) -> list[str]:
    """The names of `question` (question_names) that no passage mentions: if any, the passages cannot
    answer it, whatever a look-alike of the name in them says."""
    return [n for n in question_names(question) if not _mentioned(n, passages)]
