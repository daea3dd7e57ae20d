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
    first = re.match(r"\s*(\S+)", question)
    for m in _NAME.finditer(rest):
        words = m.group(0).split()
        if first and m.start() == first.start(1):  # "Which", "How", ...: the question's own first word
            words = words[1:]
        while words and words[0][0].islower():  # "of"/"the" left in front once the first word is dropped
            words = words[1:]
        words[-1:] = [words[-1].removesuffix("'s").rstrip("'-")] if words else []  # "Tertius's" -> "Tertius"
        if len(words) >= 2:
            names.append(" ".join(words))
    return list(dict.fromkeys(names))


def _blank(pattern: re.Pattern, text: str) -> str:
    """`text` with each match of `pattern` overwritten by "|": no name runs across it, lengths unchanged."""
    return pattern.sub(lambda m: "|" * len(m.group(0)), text)


def _mentions(text: str, name: str) -> bool:
    words = [re.escape(w) for w in name.split()]
    return re.search(r"(?<!\w)" + r"\s+".join(words) + r"(?!\w)", text, re.IGNORECASE) is not None


def _mentioned(name: str, passages: Sequence[str]) -> bool:
    parts = name.split(".")
    forms = [".".join(parts[i:]) for i in range(max(1, len(parts) - 1))]  # a.b.c -> a.b.c, b.c
    return any(_mentions(p, form) for p in passages for form in forms)


def missing_names(question: str, passages: Sequence[str]) -> list[str]:
    """The names of `question` (question_names) that no passage mentions: if any, the passages cannot
    answer it, whatever a look-alike of the name in them says."""
    return [n for n in question_names(question) if not _mentioned(n, passages)]
