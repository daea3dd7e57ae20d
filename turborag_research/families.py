"""Template families of the synthetic records, and the families held out of training.

synth.py writes every record from a template: a question, a passage layout and a kind of value.  A model
can learn a shortcut tied to one template ("answer with the value that follows 'was founded by'") that
held-out entities and domains cannot reveal, since they share the templates.  So each record belongs to a
family, the triple of

- wording: how the question is put.  "direct" is the template's own question ("Who founded {e}?"); the
  others are derived from the template by rule: "context" ("According to the passages, who founded
  {e}?"), "gap" (the template's first fact sentence with a blank for the value: "Fill in the blank: {e}
  was founded by ___, who ...") and "imperative" ("Give the founder of {e}.", from the attribute);
- layout: how the passages are written.  "prose" is the fact sentence at a random place among 1-3 filler
  sentences; "record" a fact sheet (the entity as a title line, one "Attribute: value" line for each
  attribute of the domain, a "Notes:" line of fillers); "news" a news-style paragraph of about 80-150 words
  (a lead sentence, the fact mid-paragraph among fillers, a closing sentence).  All passages of a record,
  distractors included, share its layout, so layout is no cue;
- answer_type: the kind of value asked for (ANSWER_TYPES, synth.py's value kinds).

A family is held out when any of its three parts is: HELD_OUT_WORDINGS, HELD_OUT_LAYOUTS and
HELD_OUT_ANSWER_TYPES, below.  Training mixes draw only seen families; the "synth-unseen" eval set only
families with at least one held-out part, so that a template shortcut shows up as a gap between the
"synth-seen" and "synth-unseen" scores.  The choice:

- "imperative" wording: the only wording that is not a question and the only one built from the attribute
  name, so it shares the least with the question forms a model trains on;
- "news" layout: the longest passages, with the fact buried mid-paragraph, leaving training the two most
  different layouts (prose sentences and "Attribute: value" lines);
- "material" answer type: two templates (a city's building stone, the material a treaty was written on),
  so training keeps every other type, and a material is a common lower-case word where most other values
  are invented names or numbers, so a model that answers "with a name" instead of what was asked fails it
  visibly.  Color, the other common-word type, was the held-out one at first; but the shipped adapter's
  stages (all "legacy") trained on colors, so against that adapter a color set was unseen only for the
  candidate.  No mix before the material templates could draw them: they are unseen for every adapter.

Sets of families (`FAMILY_SETS`, the `families` option of synth.generate and mix.build_mix):

- "legacy": direct wording, prose layout, every answer type but material (the shipped adapter's stages);
- "all": every wording, layout and answer type;
- "seen": every family with no held-out part;
- "unseen": every record has at least one held-out part, and records cycle through the seven combinations
  of held-out axes (wording; layout; answer type; wording and layout; ...) in a random order, so the axes
  are spread evenly; the parts that are not held out are seen ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import combinations

WORDINGS: tuple[str, ...] = ("direct", "context", "gap", "imperative")
LAYOUTS: tuple[str, ...] = ("prose", "record", "news")
ANSWER_TYPES: tuple[str, ...] = (
    "person",
    "name",
    "landmark",
    "named",
    "title",
    "number",
    "color",
    "material",
)

HELD_OUT_WORDINGS: tuple[str, ...] = ("imperative",)
HELD_OUT_LAYOUTS: tuple[str, ...] = ("news",)
HELD_OUT_ANSWER_TYPES: tuple[str, ...] = ("material",)

AXES: tuple[str, ...] = ("wording", "layout", "answer_type")  # also the record keys that carry a family
FAMILY_SETS: tuple[str, ...] = ("legacy", "all", "seen", "unseen")

_ALL = {"wording": WORDINGS, "layout": LAYOUTS, "answer_type": ANSWER_TYPES}
_HELD_OUT = {"wording": HELD_OUT_WORDINGS, "layout": HELD_OUT_LAYOUTS, "answer_type": HELD_OUT_ANSWER_TYPES}
_SEEN = {axis: tuple(v for v in _ALL[axis] if v not in _HELD_OUT[axis]) for axis in AXES}
# the seven non-empty sets of held-out axes, for "unseen"
_COMBINATIONS = [c for r in range(1, len(AXES) + 1) for c in combinations(AXES, r)]


@dataclass(frozen=True)
class Choices:
    """What one record may be drawn from: its wording and layout uniformly, its answer type by template."""

    wordings: tuple[str, ...]
    layouts: tuple[str, ...]
    answer_types: tuple[str, ...]


# The seven stages' one family: every answer type there was then, so "legacy" mixes stay what they were.
LEGACY = Choices(("direct",), ("prose",), tuple(t for t in ANSWER_TYPES if t != "material"))
ALL = Choices(WORDINGS, LAYOUTS, ANSWER_TYPES)
SEEN = Choices(_SEEN["wording"], _SEEN["layout"], _SEEN["answer_type"])


def check(families: str) -> None:
    """Reject an unknown set of families with the list of known ones."""
    if families not in FAMILY_SETS:
        raise ValueError(f"families must be one of {', '.join(FAMILY_SETS)}, got {families!r}")


def plan(families: str, n: int, rng: random.Random) -> list[Choices]:
    """The choices of each of n records.  Only "unseen" draws from rng, so the others leave it untouched."""
    check(families)
    if families != "unseen":
        return [{"legacy": LEGACY, "all": ALL, "seen": SEEN}[families]] * n
    held: list[tuple[str, ...]] = []
    while len(held) < n:  # each block of seven is a permutation: counts differ by at most one
        held += rng.sample(_COMBINATIONS, len(_COMBINATIONS))
    return [Choices(*(_HELD_OUT[a] if a in axes else _SEEN[a] for a in AXES)) for axes in held[:n]]


def held_out_parts(record: dict) -> tuple[str, ...]:
    """The axes ("wording", "layout", "answer_type") on which a record's family is held out: empty for a
    seen family, and for a record without family keys (a "legacy" one, which may well ask for a color)."""
    return tuple(axis for axis in AXES if record.get(axis) in _HELD_OUT[axis])
