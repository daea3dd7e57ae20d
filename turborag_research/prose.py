"""Plain-English questions made, by rule, from the sentences of the standard library's documentation.

realtext.py asks four templated questions about a named entity ("What does `textwrap.fill` return?"), and
synth.py asks templated questions about invented entities.  A model trained on those two and on
unanswerable questions learned to answer only those templates: given a question in any other wording it
replied "The passages do not say.", even with a single passage holding the answer sentence ("What does an
imaginary literal yield?" over "An imaginary literal yields a complex number ...": 16 of 18 such
questions over the demo corpus were declined, notes/2026-12-03-adapter-stages.md).  Abstention had become a
reaction to
the question's form, not to the passages.

This module asks questions the way a reader of documentation does, about whatever a sentence states:

- "If k is not specified, ..."               -> "What happens in math.perm if k is not specified?"
- "A right shift by n bits is defined as ..." -> "How is a right shift by n bits defined?"
- "A Counter is a dict subclass ..."          -> "What is a Counter?"
- "The target path may be absolute ..."       -> "May the target path be absolute ...?"
- "The family argument specifies ..."         -> "What does the family argument specify?"
- "There is no way to quote meta-characters." -> "Is there any way to quote meta-characters?"

The target is the whole sentence (answers of natural length); the predicate after the verb is accepted as
a shorter span by the scorer.  Passages are realtext.py's (the entity's docstring, one per passage) and
distractors are passages of the same split that state neither; so with realtext's split the eval-split
modules give held-out questions.  The rules are shallow pattern matches, not a parser: a subject is a
determiner and up to ten words with no verb-like word in them, and a sentence no rule matches is skipped.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from turborag.eval.metrics import ABSTAIN
from turborag_research.realtext import check_request, inventory
from turborag_research.text import SENTENCE_END, mentions, needles

# Sentences of answer length: long enough to say something, short enough to be generated whole.
_MIN_WORDS = 5
_MAX_WORDS = 35
_DETERMINERS = ("The", "A", "An", "This", "These", "Each", "Every", "All", "Any", "Its", "Their")
# A subject: a determiner and 1-10 more words without punctuation that would end a noun phrase.
_SUBJECT = rf"((?:{'|'.join(_DETERMINERS)}) [^,;:()]{{2,70}}?)"
# Words that mean the "subject" already holds a verb or a clause, so the split is wrong.
_CLAUSE_WORDS = frozenset(
    "is are was were be been being will would can cannot may might must should shall has have had "
    "do does did that which who whom whose when where if unless while because".split()
)
# "A ... is <participle> ..." and how to ask about it.
_PARTICIPLES = {
    "defined": "How",
    "interpreted": "How",
    "treated": "How",
    "computed": "How",
    "evaluated": "How",
    "converted": "How",
    "handled": "How",
    "stored": "How",
    "represented": "How",
    "determined": "How",
    "chosen": "How",
    "selected": "How",
    "encoded": "How",
    "decoded": "How",
    "compared": "How",
    "used": "What",  # "What is X used for?"
    "returned": "When",
    "raised": "When",
    "called": "When",
    "ignored": "When",
    "created": "When",
}
# Third-person verbs of "<subject> <verb>s <object>." and their base forms.
_VERBS = {
    "yields": "yield",
    "returns": "return",
    "raises": "raise",
    "creates": "create",
    "contains": "contain",
    "provides": "provide",
    "uses": "use",
    "accepts": "accept",
    "takes": "take",
    "supports": "support",
    "produces": "produce",
    "converts": "convert",
    "means": "mean",
    "specifies": "specify",
    "controls": "control",
    "determines": "determine",
    "represents": "represent",
    "defines": "define",
    "holds": "hold",
    "stores": "store",
    "gives": "give",
    "allows": "allow",
    "causes": "cause",
    "calls": "call",
    "reads": "read",
    "writes": "write",
    "removes": "remove",
    "adds": "add",
    "includes": "include",
    "requires": "require",
    "checks": "check",
    "generates": "generate",
    "handles": "handle",
    "encodes": "encode",
    "decodes": "decode",
    "describes": "describe",
    "indicates": "indicate",
    "prevents": "prevent",
    "ignores": "ignore",
    "matches": "match",
    "refers": "refer",
    "affects": "affect",
    "terminates": "terminate",
    "continues": "continue",
    "selects": "select",
    "implements": "implement",
    "waits": "wait",
    "blocks": "block",
    "sends": "send",
    "receives": "receive",
}
_PREPOSITIONS = frozenset("of for in to with by on from as at into over under between per about".split())
_DANGLING = frozenset("or and not to of for in with by the a an".split())
# What a passive sentence's continuation says, and the question word that asks for it.
_WHEN = re.compile(r"^(if|when|unless|after|before|once|while|in case|only if|whenever)\b")
_HOW = re.compile(r"^(as|with|by|using|in|from|through|via)\b")
_MODALS = {"can": "Can", "cannot": "Can", "may": "May", "must": "Must", "should": "Should"}
_PRONOUN = re.compile(r"^(it|they|this|these|that|those|he|she|so)\b", re.IGNORECASE)


def _lower_determiner(subject: str) -> str:
    """ "The family argument" -> "the family argument" (names and code stay as written)."""
    first, _, rest = subject.partition(" ")
    return f"{first.lower()} {rest}" if first in _DETERMINERS else subject


def _clean_subject(subject: str) -> bool:
    """A subject is a noun phrase: no clause words, not "This ..." (which would need the previous
    sentence to be understood), at most 8 words, and an article only first or after a preposition
    ("The IncrementalDecoder remembers the state ..." is a verb phrase, not a subject)."""
    words = subject.split()
    if len(words) > 8 or words[0] in ("This", "These") or words[-1].lower() in _DANGLING:
        return False
    for before, word in zip(words, words[1:]):
        if word.lower() in _CLAUSE_WORDS:
            return False
        if word.lower() in ("the", "a", "an") and before.lower() not in _PREPOSITIONS:
            return False
    return True


def _scoped(question: str, subject: str, name: str) -> str:
    """ "In math.perm, what is ...?" for a question about a short, generic subject ("the return value"),
    which would otherwise have an answer in many passages; longer subjects name their thing already."""
    return f"In {name}, {question[0].lower()}{question[1:]}" if len(subject.split()) <= 3 else question


@dataclass(frozen=True)
class Asked:
    """One question a sentence answers: the rule, the question, the sentence (the target) and the
    predicate after the verb (a shorter span the scorer accepts; None when it would be too short)."""

    rule: str
    question: str
    sentence: str
    span: str | None


def _span(text: str) -> str | None:
    text = text.strip().rstrip(".")
    return text if len(text.split()) >= 3 else None


def _conditional(m: re.Match, name: str) -> tuple[str, str | None] | None:
    cond, rest = m[2], m[3]
    # "If the items are not 1, 2, 4, or 8 bytes ..." was cut inside a list, not after the condition.
    if _PRONOUN.match(cond) or cond.split()[-1].isdigit() or re.match(r"^(\d|or |and )", rest):
        return None
    return f"What happens in {name} {m[1].lower()} {cond}?", _span(rest)


def _passive(m: re.Match, name: str) -> tuple[str, str | None] | None:
    subject, be, neg, participle, rest = m[1], m[2], m[3], m[4], m[5].strip()
    if not _clean_subject(subject):
        return None
    ask = _PARTICIPLES[participle]
    if ask == "When":  # "is returned as a bytes object" answers how, "... if ..." answers when
        ask = "When" if _WHEN.match(rest) else "How" if _HOW.match(rest) else None
    if ask is None:
        return None
    tail = " for" if participle == "used" else ""
    not_ = "not " if neg else ""
    asked = _scoped(f"{ask} {be} {_lower_determiner(subject)} {not_}{participle}{tail}?", subject, name)
    return asked, _span(rest)


def _copula(m: re.Match, name: str) -> tuple[str, str | None] | None:
    subject, be, rest = m[1], m[2], m[3]
    if not _clean_subject(subject) or be == "are" and subject.split()[0] in ("A", "An"):
        return None
    return _scoped(f"What {be} {_lower_determiner(subject)}?", subject, name), _span(rest)


def _modal(m: re.Match, name: str) -> tuple[str, str | None] | None:
    subject, modal, rest = m[1], m[2], m[3]
    if not _clean_subject(subject) or re.search(r"[;:]", rest):
        return None
    rest = re.sub(r"^(not|never|always|only|also) ", "", rest)
    return _scoped(f"{_MODALS[modal]} {_lower_determiner(subject)} {rest}?", subject, name), None


def _verb(m: re.Match, name: str) -> tuple[str, str | None] | None:
    subject, verb, rest = m[1], m[2], m[3]
    if not _clean_subject(subject):
        return None
    return _scoped(f"What does {_lower_determiner(subject)} {_VERBS[verb]}?", subject, name), _span(rest)


def _there(m: re.Match, name: str) -> tuple[str, str | None] | None:
    if re.search(r"[;:]", m[2]):
        return None
    return f"In {name}, {m[1]} there any {m[2]}?", None


_PARTICIPLE_RE = "|".join(_PARTICIPLES)
_VERB_RE = "|".join(_VERBS)
_MODAL_RE = "|".join(_MODALS)
# Tried in this order; the first that matches and accepts the sentence asks the question.
_RULES: tuple[tuple[str, re.Pattern, Callable], ...] = (
    ("conditional", re.compile(r"^(If|When) ([^,]{5,80}), (.+)\.$"), _conditional),
    ("passive", re.compile(rf"^{_SUBJECT} (is|are) (not )?({_PARTICIPLE_RE})\b(.*)\.$"), _passive),
    ("copula", re.compile(rf"^{_SUBJECT} (is|are) ((?:a|an|the) .+)\.$"), _copula),
    ("modal", re.compile(rf"^{_SUBJECT} ({_MODAL_RE}) (.+)\.$"), _modal),
    ("verb", re.compile(rf"^{_SUBJECT} ({_VERB_RE}) (.+)\.$"), _verb),
    ("there", re.compile(r"^There (is|are) no (.+)\.$"), _there),
)
RULES: tuple[str, ...] = tuple(name for name, _, _ in _RULES)


def ask(sentence: str, name: str) -> Asked | None:
    """The question a sentence of `name`'s documentation answers, or None if no rule fits it."""
    sentence = " ".join(sentence.split())
    if not _MIN_WORDS <= len(sentence.split()) <= _MAX_WORDS or "`" in sentence or "\\" in sentence:
        return None
    for rule, pattern, make in _RULES:
        m = pattern.match(sentence)
        if m and (made := make(m, name)):
            question, span = made
            return Asked(rule, " ".join(question.split()), sentence, span)
    return None


@cache
def _questions(split: str) -> tuple[tuple[int, Asked], ...]:
    """(entity index, question) for every sentence of the split's passages that a rule can ask about."""
    out = []
    for i, entity in enumerate(inventory()[split].entities):
        body = entity.passage.split("\n", 1)[-1]
        for sentence in SENTENCE_END.split(body):
            if asked := ask(sentence, entity.display):
                out.append((i, asked))
    return tuple(out)


@cache
def _by_rule(split: str) -> dict[str, tuple[int, ...]]:
    """Indexes into `_questions(split)` by rule, so that each rule is drawn equally often: the
    conditional rule alone matches half of all sentences."""
    index: dict[str, list[int]] = {}
    for j, (_, asked) in enumerate(_questions(split)):
        index.setdefault(asked.rule, []).append(j)
    return {rule: tuple(v) for rule, v in index.items()}


def prose_stats(split: str = "train") -> dict[str, int]:
    """Questions per rule in a split (`data prose --stats`)."""
    return {rule: len(v) for rule, v in sorted(_by_rule(split).items())}


def _record(rng: random.Random, split: str, contexts: int) -> dict:
    """One answerable record: a question, its entity's passage among contexts - 1 passages of the split
    that state neither the sentence nor its span."""
    by_rule = _by_rule(split)
    rule = rng.choice(sorted(by_rule))
    entity_index, asked = _questions(split)[rng.choice(by_rule[rule])]
    entities = inventory()[split].entities
    entity = entities[entity_index]
    answers = [asked.sentence] + ([asked.span] if asked.span else [])
    forbidden = needles(answers)
    used = {entity.passage}
    distractors: list[str] = []
    for _ in range(2000):
        if len(distractors) == contexts - 1:
            break
        passage = entities[rng.randrange(len(entities))].passage
        if passage not in used and not mentions(passage, forbidden):
            used.add(passage)
            distractors.append(passage)
    if len(distractors) < contexts - 1:
        raise RuntimeError(f"could not find {contexts - 1} distractors for {asked.question!r}")
    position = rng.randrange(contexts)
    return {
        "question": asked.question,
        "answers": answers,
        "contexts": distractors[:position] + [entity.passage] + distractors[position:],
        "source": f"prose:{entity.module}",
        "kind": asked.rule,
        "entity": entity.display,
        "answer_index": position,
        "answerable": True,
    }


def without_answer(record: dict) -> dict:
    """The record minus the passage that answers it; the target is the abstention."""
    i = record["answer_index"]
    return {
        **record,
        "answers": [ABSTAIN],
        "contexts": record["contexts"][:i] + record["contexts"][i + 1 :],
        "answer_index": None,
        "answerable": False,
    }


def generate_prose(
    n: int, contexts: int, seed: int = 0, split: str = "train", unanswerable: float = 0.0
) -> list[dict]:
    """n plain-English QA records over stdlib documentation with `contexts` passages each, deterministic
    for a seed (and a Python build).  A fraction `unanswerable` (exactly round(n * unanswerable)) are
    asked over the same kind of passages without the answering one (`contexts` passages all the same).
    Records: question, answers (the sentence first, then the predicate), contexts, source
    ("prose:<module>"), kind (the rule), entity, answer_index (None when unanswerable), answerable.
    """
    check_request(n, contexts, split, unanswerable)
    rng = random.Random(seed)
    missing = set(rng.sample(range(n), round(n * unanswerable)))
    out = []
    for i in range(n):
        if i in missing:
            out.append(without_answer(_record(rng, split, contexts + 1)))
        else:
            out.append(_record(rng, split, contexts))
    return out
