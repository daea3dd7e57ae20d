"""Answer scoring for short-answer QA.

Generated answers are free text ("The company was founded by Ismena Throll."), so they are compared with the
gold answers after SQuAD normalisation, which makes the score ignore case, punctuation and articles.  Two
scores are offered: `exact_match` (SQuAD EM, strict, suits extractive readers) and `contains_answer`
(the accuracy used by the RGB benchmark, lenient, suits chatty generative models).

Questions the passages cannot answer have one fixed target, `ABSTAIN`; `abstains` recognises it in free
text, so that a model that declines in its own words ("Sorry, the passages do not say that.") counts too.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence

from turborag.core.prompt import ABSTAIN  # the reply the prompt asks for when no passage answers

__all__ = ["ABSTAIN", "abstains", "contains_answer", "exact_match", "normalize_answer", "paired_difference"]

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


def contains_answer(prediction: str, answers: Sequence[str]) -> bool:
    """True if any gold answer occurs in the prediction as whole words (RGB-style accuracy).

    Both sides are padded with spaces so that "1999" does not match inside "19990".
    """
    padded = f" {normalize_answer(prediction)} "
    return any(f" {gold} " in padded for gold in _normalized_golds(answers))


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
