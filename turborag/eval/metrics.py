"""Answer scoring for short-answer QA.

Generated answers are free text ("The company was founded by Ismena Throll."), so they are compared with the
gold answers after SQuAD normalisation, which makes the score ignore case, punctuation and articles.  Three
scores are offered: `exact_match` (SQuAD EM, strict, suits extractive readers), `contains_answer` (ours: a
gold answer occurs in the answer as whole words, lenient, suits chatty generative models) and
`rgb_contains` (the RGB benchmark's own: a lower-cased substring, so "8" counts inside "78").

`contains_answer` reads the answer the way a person would on real text, which SQuAD's ASCII-only
normalisation does not: Unicode punctuation (curly quotes, guillemets) is dropped, Unicode dashes separate
words ("1990–1995" holds "1990"; the ASCII hyphen joins them, as in SQuAD), and an ordinal suffix, a
possessive or a plural on the last word
does not fail a right answer ("February 21st" for "February 21", "Norway's" for "Norway", "gold medals" for
"gold medal").  It stays whole-word: "1999" does not match inside "19990".

Questions the passages cannot answer have one fixed target, `ABSTAIN`; `abstains` recognises it in free
text, so that a model that declines in its own words ("Sorry, the passages do not say that.") counts too.
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections.abc import Sequence

from turborag.core.prompt import ABSTAIN  # the reply the prompt asks for when no passage answers

__all__ = [
    "ABSTAIN",
    "SCORINGS",
    "abstains",
    "contains_answer",
    "exact_match",
    "match_words",
    "normalize_answer",
    "paired_difference",
    "rgb_contains",
    "rgb_declines",
]

SCORINGS = ("ours", "rgb")  # `turborag eval --scoring`: contains_answer, or RGB's own substring match

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace, in the SQuAD script's order."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _normalized_golds(answers: Sequence[str]) -> list[str]:
    """Normalise the gold answers and drop empty ones, so that an empty gold never matches everything."""
    golds = (normalize_answer(a) for a in answers)
    return [g for g in golds if g]


# "Norway's" -> "Norway" (straight or curly apostrophe), before punctuation is dropped and "norways" is left.
_POSSESSIVE = re.compile(r"(\w)['\u2019]s\b")
# "21st" -> "21": an ordinal suffix right after a digit.
_ORDINAL = re.compile(r"\b(\d+)(?:st|nd|rd|th)\b")


def _strip_char(ch: str) -> str:
    """Dashes (Unicode category Pd) become a space, other punctuation goes.  The ASCII hyphen goes too, as in
    SQuAD: "content-type" stays one word, so a passage's "content type" does not state it."""
    category = unicodedata.category(ch)
    if category == "Pd" and ch != "-":
        return " "
    return "" if category.startswith("P") or ch in _PUNCTUATION else ch


def match_words(s: str) -> list[str]:
    """The words `contains_answer` compares: lower case, Unicode-aware punctuation, no possessive `'s`,
    no ordinal suffix, no articles.  Applied to the prediction and the gold answers alike."""
    s = unicodedata.normalize("NFKC", s).lower()  # NFKC folds full-width forms and ligatures
    s = _POSSESSIVE.sub(r"\1", s)
    s = "".join(_strip_char(ch) for ch in s)
    s = _ORDINAL.sub(r"\1", s)
    return _ARTICLES.sub(" ", s).split()


def _matches_at(words: list[str], i: int, gold: list[str]) -> bool:
    """Gold's words at words[i:], the last one also as a plural (+s, +es) when it is alphabetic."""
    *head, last = gold
    if words[i : i + len(head)] != head or i + len(gold) > len(words):
        return False
    got = words[i + len(head)]
    return got == last or (last.isalpha() and got in (last + "s", last + "es"))


def contains_answer(prediction: str, answers: Sequence[str]) -> bool:
    """True if any gold answer occurs in the prediction as whole words (`match_words`).

    Words are compared, not characters, so "1999" does not match inside "19990" and "8" not inside "78".
    """
    words = match_words(prediction)
    for answer in answers:
        gold = match_words(answer)
        if gold and any(_matches_at(words, i, gold) for i in range(len(words) - len(gold) + 1)):
            return True
    return False


def rgb_contains(prediction: str, answers: Sequence[str]) -> bool:
    """RGB's own accuracy: some (non-empty) alternative is a lower-cased substring of the prediction."""
    lowered = prediction.lower()
    return any(a.strip() and a.lower() in lowered for a in answers)


def rgb_declines(prediction: str) -> bool:
    """RGB's refusal check (its phrase "insufficient information"), or ours (`abstains`)."""
    return "insufficient information" in prediction.lower() or abstains(prediction)


def exact_match(prediction: str, answers: Sequence[str]) -> bool:
    """True if the normalised prediction equals any normalised gold answer (SQuAD EM)."""
    normalized = normalize_answer(prediction)
    return any(normalized == gold for gold in _normalized_golds(answers))


# The normalised core of ABSTAIN that a prediction must contain to count as an abstention.
_ABSTAIN_CORE = " passages do not say "


def abstains(prediction: str) -> bool:
    """True if the prediction declines to answer: its normalised text contains "passages do not say".

    Only the core phrase is required, as whole words, so that "The passages do not say." and "Sorry, the
    passages do not say who founded it" both count while an answer that merely mentions passages does not.
    """
    return _ABSTAIN_CORE in f" {normalize_answer(prediction)} "


def paired_difference(a: Sequence[bool], b: Sequence[bool]) -> tuple[int, int, float]:
    """(questions only `a` got right, questions only `b` got right, two-sided exact sign-test p).

    Two modes answered the same questions, so their accuracies differ only where they disagree; under "the
    modes are equally good" each disagreement is a fair coin (McNemar's exact test).  A 2-point gap on 150
    questions can be 6 against 3 disagreements (p = 0.51): the p says whether the set can see the gap.
    """
    if len(a) != len(b):
        raise ValueError(f"paired scores must have one entry per question each, got {len(a)} and {len(b)}")
    only_a = sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    n, k = only_a + only_b, min(only_a, only_b)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return only_a, only_b, p
