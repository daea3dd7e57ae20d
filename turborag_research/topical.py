"""Unanswerable questions that keep their topic: the answering passage stays, minus what answers.

The unanswerable questions of the mix leave the answering passage out (`mix.twin`) or ask about an entity
no passage names (synth.py's near-namesakes).  Either way the asked entity is missing from the passages, so
a model can learn "decline when the entity is absent", and it did: every adapter declined 97-98% of our own
twins, yet only 19-39% of RGB's en_none questions, whose passages are news on the asked topic (the event,
the person) that do not state the asked fact.  That kind of question is made here from our own answerable
records: the answering passage is kept, with every sentence (or fact-sheet line) that states an accepted
answer taken out, so the passages still name the entity and say other things about it, just not the
answer.

`strip_answer` works on passages in their raw layout (one sentence list per line: synth.py's prose, news
and fact sheets, realtext.py's "signature\\nprose"), so a twin is made before docstyle.py wraps a passage.
A passage that still mentions an answer after the cut, or keeps fewer than MIN_WORDS words, gives no twin
(None): a question whose answer is restated in words no answer string matches can still slip through on
stdlib text, which is the label noise this generator carries; synthetic facts are stated once.
"""

from __future__ import annotations

from turborag.eval.metrics import ABSTAIN
from turborag_research.text import SENTENCE_END, mentions, needles

MIN_WORDS = 12  # what must be left of the answering passage: a title line alone says nothing on the topic


def strip_answer(passage: str, answers: list[str]) -> str | None:
    """The passage without the sentences and lines that mention any of `answers`, or None if what is left
    still mentions one (a sentence split that missed) or has fewer than MIN_WORDS words."""
    found = needles(answers)
    lines = []
    for line in passage.split("\n"):
        kept = [s for s in SENTENCE_END.split(line) if not mentions(s, found)]
        if any(s.strip() for s in kept):
            lines.append(" ".join(kept))
    text = "\n".join(lines)
    if len(text.split()) < MIN_WORDS or mentions(text, found):
        return None
    return text


def topical_twin(record: dict) -> dict | None:
    """The unanswerable twin of an answerable record that keeps its topic: the same question over the same
    passages, in the same order, with the answering passage stripped of its answer (`strip_answer`); the
    target is the abstention.  None when the passage cannot be stripped cleanly."""
    i = record["answer_index"]
    stripped = strip_answer(record["contexts"][i], record["answers"])
    if stripped is None:
        return None
    contexts = list(record["contexts"])
    contexts[i] = stripped
    return {
        **record,
        "answers": [ABSTAIN],
        "contexts": contexts,
        "answer_index": None,
        "answerable": False,
        "topical": True,
    }
