"""Synthetic multi-document QA over invented facts.

A retrieval-augmented reader has to be evaluated on questions that only the given passages can answer;
otherwise a model that memorised the answer during pretraining looks like a good reader.  Every entity and
value here is built from random syllables, so the gold passage is the only place the answer can come from.
The distractors are made to look as much like the gold passage as possible (same domain, same attribute,
other entities with other values), plus a few from other domains, so that a model has to read the right
passage instead of copying the first plausible value it sees.

The domains themselves (entity kinds, attributes, questions, fact and filler sentences) are data, in
turborag_research/data/synth_domains.json, read at import; this module holds the mechanism that invents
names and values and assembles the records.

Three opt-in variants serve the cache-aware fine-tune (all off by default, and the default output is
unchanged by them): `hard` adds look-alike distractors whose entity differs from the gold one by a single
letter ("Veltrano Dynamics" / "Veltreno Dynamics"), since the error that chunk-cache reuse makes is a value
read from a look-alike passage; `unanswerable` drops the gold passage and keeps the look-alikes, with the
abstention string as the answer; `sentence_answers` puts the gold fact sentence first among the answers,
so a model trained on answers[0] learns to answer in a sentence instead of one word.

Template families (families.py): a record's question wording, passage layout and answer type.  By default
(`families="legacy"`) every record has one family (the template's own question, the fact among filler
sentences, any answer type) and no family draw is made; "all", "seen" and "unseen" draw other wordings and
layouts, and hold out or ask only for the held-out families, so that a shortcut tied to a template shows up
as a gap between a seen-family and an unseen-family score.  Records of those sets carry `wording`,
`layout` and `answer_type`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from string import Formatter

from turborag.eval.metrics import ABSTAIN, normalize_answer
from turborag_research import families as fam
from turborag_research.text import mentions, needles

# Passages get filler sentences up to this length, so that they look like ordinary retrieved chunks.
_MIN_WORDS = 40
_MAX_SENTENCES = 4
# Distractors are redrawn when they happen to mention the gold answer or entity; this bounds the redraws.
_MAX_TRIES = 200
# Hard records: at most this many same-template distractors get a look-alike entity name.
_MAX_LOOKALIKES = 4


@dataclass(frozen=True)
class _Value:
    """An attribute value: how the passage writes it, and the answer strings that count as correct."""

    text: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class _Template:
    """One attribute of a domain: the question, the ways of stating the fact, and how to invent a value."""

    attribute: str  # a noun phrase that reads in "the {attribute} of {e}": "founding year"
    question: str  # formatted with e=entity
    facts: tuple[str, ...]  # formatted with e=entity, v=value text
    make_value: Callable[[random.Random], _Value]
    answer_type: str  # the value kind: "person", "number", ... (families.ANSWER_TYPES)
    unit: str = ""  # what a number counts ("days"), for a fact sheet's line and the imperative wording


@dataclass(frozen=True)
class _Domain:
    """A kind of entity, its attributes, and filler sentences that say nothing about those attributes."""

    name: str
    make_entity: Callable[[random.Random], str]
    templates: tuple[_Template, ...]
    fillers: tuple[str, ...]  # formatted with e=entity
    # the real words of its entity names ("Dynamics", "Treaty", "of"): look-alikes change only made-up ones
    fixed_words: frozenset[str] = frozenset()


# --- invented names --------------------------------------------------------------------------------------

_ONSETS = (
    "b",
    "br",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "qu",
    "r",
    "s",
    "st",
    "t",
    "th",
    "tr",
    "v",
    "z",
)
_MEDIAL_ONSETS = ("b", "d", "g", "k", "l", "m", "n", "r", "s", "t", "v", "z")  # clusters here read badly
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ae", "ei", "ou")
_MEDIAL_CODAS = ("l", "n", "r")
_FINAL_CODAS = ("l", "n", "r", "s", "th", "k", "rk", "nd", "x", "ll", "v")
_COLORS = (
    "crimson",
    "cobalt blue",
    "emerald green",
    "saffron",
    "violet",
    "silver",
    "amber",
    "turquoise",
    "scarlet",
    "ivory",
    "charcoal grey",
    "magenta",
)


def _word(rng: random.Random, min_syllables: int = 2, max_syllables: int = 3) -> str:
    """A pronounceable made-up word such as "Quorvik", so that no model has seen facts about it."""
    n = rng.randint(min_syllables, max_syllables)
    syllables = []
    for i in range(n):
        onset = rng.choice(_ONSETS if i == 0 else _MEDIAL_ONSETS)
        if i == n - 1:
            coda = rng.choice(_FINAL_CODAS) if rng.random() < 0.6 else ""
        else:
            coda = rng.choice(_MEDIAL_CODAS) if rng.random() < 0.25 else ""
        syllables.append(onset + rng.choice(_VOWELS) + coda)
    return "".join(syllables).capitalize()


def _with_suffix(*suffixes: str) -> Callable[[random.Random], str]:
    """Entity maker for names like "Veltrano Dynamics": a made-up word plus a real-sounding kind."""
    return lambda rng: f"{_word(rng)} {rng.choice(suffixes)}"


def _with_prefix(*prefixes: str) -> Callable[[random.Random], str]:
    """Entity maker for names like "Treaty of Quorvik"."""
    return lambda rng: f"{rng.choice(prefixes)} {_word(rng)}"


_FILM_WORDS = ("Inheritance", "Affair", "Protocol", "Covenant", "Horizon")


def _film_title(rng: random.Random) -> str:
    """A made-up film title such as "The Velmora Inheritance"."""
    return f"The {_word(rng)} {rng.choice(_FILM_WORDS)}"


def _compound(rng: random.Random) -> str:
    """A made-up chemical name such as "Zerathine"."""
    return _word(rng, 2, 2) + rng.choice(("ine", "ium", "ol", "ate", "ide", "ene"))


# --- value makers ----------------------------------------------------------------------------------------


def _person(*titles: str) -> Callable[[random.Random], _Value]:
    """A made-up person; titled names also accept the bare name ("Dr. Ismena Throll" / "Ismena Throll")."""

    def make(rng: random.Random) -> _Value:
        name = f"{_word(rng)} {_word(rng, 1, 2)}"
        if titles and rng.random() < 0.4:
            titled = f"{rng.choice(titles)} {name}"
            return _Value(titled, (name, titled))
        return _Value(name, (name,))

    return make


def _name(rng: random.Random) -> _Value:
    """A bare made-up name: a town, a product, a star."""
    name = _word(rng)
    return _Value(name, (name,))


def _landmark(*kinds: str) -> Callable[[random.Random], _Value]:
    """A named place like "Ostrel River"; the bare name is accepted too, as people drop the kind."""

    def make(rng: random.Random) -> _Value:
        name = _word(rng)
        full = f"{name} {rng.choice(kinds)}"
        return _Value(full, (full, name))

    return make


def _named(*kinds: str) -> Callable[[random.Random], _Value]:
    """A made-up name followed by a kind ("Tornel root"), where the bare name alone would not be an answer."""

    def make(rng: random.Random) -> _Value:
        full = f"{_word(rng)} {rng.choice(kinds)}"
        return _Value(full, (full,))

    return make


def _title(*patterns: str) -> Callable[[random.Random], _Value]:
    """A made-up title such as "Songs of Quorvik"; patterns are formatted with w=word."""
    for pattern in patterns:
        if _fields(pattern) != {"w"}:
            raise ValueError(f"title pattern {pattern!r} must use {{w}} and no other placeholder")

    def make(rng: random.Random) -> _Value:
        text = rng.choice(patterns).format(w=_word(rng))
        return _Value(text, (text,))

    return make


def _number(low: int, high: int, step: int = 1) -> Callable[[random.Random], _Value]:
    """A number written as digits, which is how a reader is expected to answer it."""
    if step < 1 or low > high:
        raise ValueError(f"a number range needs low <= high and step >= 1, got {low}, {high}, {step}")

    def make(rng: random.Random) -> _Value:
        text = str(rng.randint(low // step, high // step) * step)
        return _Value(text, (text,))

    return make


def _color(rng: random.Random) -> _Value:
    """A color word; the small set makes same-attribute distractors frequent and the task harder."""
    color = rng.choice(_COLORS)
    return _Value(color, (color,))


def _material(*words: str) -> Callable[[random.Random], _Value]:
    """A common lower-case word from the template's own list ("granite", "beeswax"): like a color, a value
    that is no invented name, so a reader that answers "with a name" instead of what was asked fails it."""
    if len(set(words)) < 2:
        raise ValueError("a material needs at least two different words")

    def make(rng: random.Random) -> _Value:
        word = rng.choice(words)
        return _Value(word, (word,))

    return make


# --- domains ---------------------------------------------------------------------------------------------

_DATA_FILE = "data/synth_domains.json"
_DOMAIN_KEYS = ("name", "entity", "templates", "fillers")
_TEMPLATE_KEYS = ("attribute", "question", "facts", "value")
_OPTIONAL_TEMPLATE_KEYS = ("unit",)


@dataclass(frozen=True)
class _Kind:
    """A maker kind the data file may name: the factory that its arguments are passed to, and their shape."""

    factory: Callable[..., Callable[[random.Random], object]]
    arg_type: type = str
    min_args: int = 0
    max_args: int | None = None


# The data file writes an entity or value maker as [kind, *arguments], e.g. ["suffix", "Labs", "Systems"] or
# ["number", 1650, 2015]; kinds without arguments map to the plain maker function.
_ENTITY_KINDS = {
    "word": _Kind(lambda: _word, max_args=0),
    "suffix": _Kind(_with_suffix, min_args=1),
    "prefix": _Kind(_with_prefix, min_args=1),
    "film_title": _Kind(lambda: _film_title, max_args=0),
    "compound": _Kind(lambda: _compound, max_args=0),
}
_VALUE_KINDS = {
    "person": _Kind(_person),
    "name": _Kind(lambda: _name, max_args=0),
    "landmark": _Kind(_landmark, min_args=1),
    "named": _Kind(_named, min_args=1),
    "title": _Kind(_title, min_args=1),
    "number": _Kind(_number, arg_type=int, min_args=2, max_args=3),  # low, high, optional step
    "color": _Kind(lambda: _color, max_args=0),
    "material": _Kind(_material, min_args=2),
}


def _fields(text: str) -> set[str]:
    """The {placeholders} of a sentence template."""
    return {field for _, field, _, _ in Formatter().parse(text) if field is not None}


def _braced(fields: set[str]) -> str:
    """Placeholders as they are written in a template, for error messages: "{e}, {v}"."""
    return ", ".join(f"{{{field}}}" for field in sorted(fields))


def _maker(spec: object, kinds: dict[str, _Kind], where: str) -> Callable[[random.Random], object]:
    """Build a maker from its [kind, *arguments] spec, checking the kind and the arguments."""
    if not isinstance(spec, list) or not spec or spec[0] not in kinds:
        raise ValueError(f"{where} must be [kind, *arguments], kind one of {', '.join(kinds)}; got {spec!r}")
    kind, args = kinds[spec[0]], spec[1:]
    if len(args) < kind.min_args or (kind.max_args is not None and len(args) > kind.max_args):
        most = "any number" if kind.max_args is None else kind.max_args
        raise ValueError(f"{where} {spec!r}: {spec[0]!r} takes {kind.min_args} to {most} arguments")
    if any(type(arg) is not kind.arg_type for arg in args):  # `type is`, so that true is not taken for 1
        raise ValueError(f"{where} {spec!r}: the arguments of {spec[0]!r} must be {kind.arg_type.__name__}s")
    try:
        return kind.factory(*args)
    except ValueError as e:
        raise ValueError(f"{where} {spec!r}: {e}") from None


def _sentences(
    raw: object, required: set[str], allowed: set[str], where: str, least: int = 1
) -> tuple[str, ...]:
    """Check a list of sentence templates: how many, and that they use exactly the placeholders they should.

    A missing {v} in a fact would make a gold passage that does not state the answer, and a {v} in a filler a
    KeyError in the middle of generation, so both are caught here instead.
    """
    if not isinstance(raw, list) or len(raw) < least or not all(isinstance(s, str) for s in raw):
        raise ValueError(f"{where} must be a list of at least {least} strings")
    for sentence in raw:
        try:
            fields = _fields(sentence)
        except ValueError as e:  # unbalanced braces
            raise ValueError(f"{where}: {sentence!r}: {e}") from None
        if required - fields:
            raise ValueError(f"{where}: {sentence!r} lacks {_braced(required - fields)}")
        if fields - allowed:
            raise ValueError(
                f"{where}: {sentence!r} uses {_braced(fields - allowed)}; only {_braced(allowed)} here"
            )
    return tuple(raw)


def _object(raw: object, keys: tuple[str, ...], where: str, optional: tuple[str, ...] = ()) -> dict:
    """Check that an entry is an object with exactly the given keys (and perhaps the optional ones), so
    that a misspelt key is not ignored."""
    if not isinstance(raw, dict) or not set(keys) <= set(raw) <= {*keys, *optional}:
        got = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        also = f" (optional: {', '.join(optional)})" if optional else ""
        raise ValueError(f"{where} must be an object with keys {', '.join(keys)}{also}; got {got}")
    return raw


def _template(raw: object, where: str) -> _Template:
    """One attribute of a domain from its data-file entry."""
    raw = _object(raw, _TEMPLATE_KEYS, where, _OPTIONAL_TEMPLATE_KEYS)
    for key in ("attribute", "question", "unit"):
        if key in raw and (not isinstance(raw[key], str) or not raw[key]):
            raise ValueError(f"{where}.{key} must be a non-empty string")
    (question,) = _sentences([raw["question"]], {"e"}, {"e"}, f"{where}.question")
    facts = _sentences(raw["facts"], {"e", "v"}, {"e", "v"}, f"{where}.facts")
    make_value = _maker(raw["value"], _VALUE_KINDS, f"{where}.value")
    return _Template(raw["attribute"], question, facts, make_value, raw["value"][0], raw.get("unit", ""))


def _domain(raw: object, index: int) -> _Domain:
    """One domain from its data-file entry; any problem is reported with the domain's name."""
    name = raw.get("name") if isinstance(raw, dict) else None
    label = repr(name) if isinstance(name, str) and name else f"#{index}"
    try:
        raw = _object(raw, _DOMAIN_KEYS, "the entry")
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        if not isinstance(raw["templates"], list) or not raw["templates"]:
            raise ValueError("templates must be a non-empty list")
        templates = tuple(_template(t, f"templates[{i}]") for i, t in enumerate(raw["templates"]))
        # A passage can take up to _MAX_SENTENCES - 1 distinct fillers.
        fillers = _sentences(raw["fillers"], set(), {"e"}, "fillers", least=_MAX_SENTENCES - 1)
        make_entity = _maker(raw["entity"], _ENTITY_KINDS, "entity")
    except ValueError as e:
        raise ValueError(f"synth domain {label}: {e}") from None
    fixed = {word for arg in raw["entity"][1:] for word in str(arg).split()}
    fixed |= {"The", *_FILM_WORDS} if raw["entity"][0] == "film_title" else set()
    return _Domain(name, make_entity, templates, fillers, frozenset(fixed))


def parse_domains(data: object) -> tuple[_Domain, ...]:
    """Build the domains from the parsed data file, checking every entry so that mistakes fail loudly here."""
    if not isinstance(data, dict) or not isinstance(data.get("domains"), list) or not data["domains"]:
        raise ValueError('synth domain data must be an object with a non-empty "domains" list')
    domains = tuple(_domain(raw, i) for i, raw in enumerate(data["domains"]))
    names = [domain.name for domain in domains]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"synth domain(s) {', '.join(map(repr, duplicates))} defined more than once")
    return domains


def _load_domains() -> dict[str, _Domain]:
    """The domains by name, in file order, from the data file shipped in the package."""
    resource = files("turborag_research").joinpath(_DATA_FILE)
    try:
        domains = parse_domains(json.loads(resource.read_text(encoding="utf-8")))
    except ValueError as e:
        raise ValueError(f"{resource}: {e}") from None
    return {domain.name: domain for domain in domains}


_DOMAINS = _load_domains()  # read once, at import: a few kB of JSON
_DOMAIN_LIST = tuple(_DOMAINS.values())
DOMAINS: tuple[str, ...] = tuple(_DOMAINS)


# --- passages and records --------------------------------------------------------------------------------


def _sentence(template: str, **fields: str) -> str:
    """Fill a sentence template and capitalise it, since entities like "the Velmari moth" may come first."""
    text = template.format(**fields)
    return text[0].upper() + text[1:]


def _passage(
    rng: random.Random,
    domain: _Domain,
    template: _Template,
    entity: str,
    value: _Value,
    layout: str = "prose",
) -> str:
    """A passage about one entity that states one fact, in one of the layouts of families.py."""
    return _passage_and_fact(rng, domain, template, entity, value, layout)[0]


def _passage_and_fact(
    rng: random.Random,
    domain: _Domain,
    template: _Template,
    entity: str,
    value: _Value,
    layout: str = "prose",
) -> tuple[str, str]:
    """`_passage`, and the sentence that states the fact (the natural-length answer of
    `sentence_answers`)."""
    if layout == "record":
        return _fact_sheet(rng, domain, template, entity, value)
    if layout == "news":
        return _news(rng, domain, template, entity, value)
    return _prose(rng, domain, template, entity, value)


def _prose(
    rng: random.Random, domain: _Domain, template: _Template, entity: str, value: _Value
) -> tuple[str, str]:
    """2-4 sentences about one entity with the fact at a random position among filler sentences.

    The fact moves around so that a reader cannot learn to look only at the first or last sentence.
    """
    pool = rng.sample(domain.fillers, len(domain.fillers))
    fillers = [_sentence(f, e=entity) for f in pool[: rng.randint(1, _MAX_SENTENCES - 1)]]
    fact = _sentence(rng.choice(template.facts), e=entity, v=value.text)
    words = len(fact.split()) + sum(len(f.split()) for f in fillers)
    while words < _MIN_WORDS and len(fillers) < _MAX_SENTENCES - 1:
        extra = _sentence(pool[len(fillers)], e=entity)
        fillers.append(extra)
        words += len(extra.split())
    position = rng.randint(0, len(fillers))
    return " ".join(fillers[:position] + [fact] + fillers[position:]), fact


def _other_value(rng: random.Random, template: _Template, forbidden: Sequence[tuple[str, str]]) -> _Value:
    """A value of the template that mentions none of the forbidden strings (the gold answers)."""
    for _ in range(_MAX_TRIES):
        value = template.make_value(rng)
        if not mentions(value.text, forbidden):
            return value
    raise RuntimeError(f"could not draw a value for {template.attribute!r} in {_MAX_TRIES} tries")


def _fact_sheet(
    rng: random.Random, domain: _Domain, template: _Template, entity: str, value: _Value
) -> tuple[str, str]:
    """A fact sheet: the entity as a title line, an "Attribute: value" line for every attribute of the
    domain (but held-out answer types, below) in a random order (the others with invented values that do
    not restate this one), and a "Notes:" line of one or two fillers.

    The fact returned is the asked line said as a sentence ("The founder of X is Y."), since a line such
    as "Founder: Y" is no answer in a sentence; it states nothing the line does not."""
    forbidden = needles(value.answers)
    lines = []
    # a held-out answer type gets a line only on a sheet that is asked about one, so that no training
    # passage states a value of that type
    held = set(fam.HELD_OUT_ANSWER_TYPES) - {template.answer_type}
    for t in (t for t in domain.templates if t.answer_type not in held):
        v = value if t is template else _other_value(rng, t, forbidden)
        unit = f" {t.unit}" if t.unit else ""
        lines.append(f"{t.attribute[0].upper()}{t.attribute[1:]}: {v.text}{unit}")
    rng.shuffle(lines)
    notes = rng.sample(domain.fillers, rng.randint(1, 2))
    notes_line = "Notes: " + " ".join(_sentence(f, e=entity) for f in notes)
    unit = f" {template.unit}" if template.unit else ""
    fact = f"The {template.attribute} of {_entity_phrase(template, entity)} is {value.text}{unit}."
    return "\n".join([entity, *lines, notes_line]), fact


# Sentences of the news layout that hold for any entity; {e} is the entity as the question names it
# ("the Quorvik Falcons"), never the subject, so no verb has to agree with it.  No color words or digits,
# which could restate a gold answer.
_NEWS_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_NEWS_LEADS = (
    "Fresh details about {e} came to light this week.",
    "Our correspondent spent several days asking around about {e}.",
    "Readers have sent in a steady stream of questions about {e} this month.",
    "This week's feature takes a closer look at {e}.",
    "Old archives and a few long interviews shed new light on {e} this week.",
)
_NEWS_CLOSES = (
    "Further reporting on {e} is expected in the coming weeks.",
    "Requests for further comment went unanswered by the time of publication.",
    "A longer feature on {e} is planned for a later edition.",
    "The full interviews will appear in next week's edition.",
)
_NEWS_EXTRAS = (
    "The details were confirmed by two people familiar with the matter.",
    "Several of those interviewed asked not to be named.",
    "Officials said that the figures would be reviewed again next year.",
    "The story drew a large number of letters from readers.",
    "Some of the older records on the subject are incomplete.",
    "Observers expect the matter to come up again before long.",
)
_NEWS_MIN_WORDS = 80
_NEWS_MAX_FILLERS = 5


def _entity_phrase(template: _Template, entity: str) -> str:
    """The entity as the template's question names it: "the Quorvik Falcons" or "Veltrano Dynamics"."""
    return f"the {entity}" if "the {e}" in template.question else entity


def _news(
    rng: random.Random, domain: _Domain, template: _Template, entity: str, value: _Value
) -> tuple[str, str]:
    """A news-style paragraph of about 80-150 words: a dateline and a lead sentence, up to five fillers
    with the fact among them (never first or last), extra sentences up to 80 words, a closing sentence."""
    named = _entity_phrase(template, entity)
    fillers = [
        _sentence(f, e=entity)
        for f in rng.sample(domain.fillers, min(len(domain.fillers), _NEWS_MAX_FILLERS))
    ]
    fact = _sentence(rng.choice(template.facts), e=entity, v=value.text)
    position = rng.randint(1, len(fillers) - 1)
    body = fillers[:position] + [fact] + fillers[position:]
    lead = f"{rng.choice(_NEWS_DAYS)}, from our correspondent. " + rng.choice(_NEWS_LEADS).format(e=named)
    close = rng.choice(_NEWS_CLOSES).format(e=named)
    extras = rng.sample(_NEWS_EXTRAS, len(_NEWS_EXTRAS))
    words = sum(len(s.split()) for s in (lead, *body, close))
    while words < _NEWS_MIN_WORDS and extras:
        body.append(extras.pop())
        words += len(body[-1].split())
    return " ".join([lead, *body, close]), fact


def _question(template: _Template, wording: str, entity: str) -> str:
    """The question of a template in one of the wordings of families.py."""
    question = template.question.format(e=entity)
    if wording == "context":  # the question word in lower case, unless the question opens with the entity
        opening = question if template.question.startswith("{") else question[0].lower() + question[1:]
        return f"According to the passages, {opening}"
    if wording == "gap":
        return "Fill in the blank: " + _sentence(template.facts[0], e=entity, v="___")
    if wording == "imperative":
        unit = f", in {template.unit}" if template.unit else ""
        return f"Give the {template.attribute} of {_entity_phrase(template, entity)}{unit}."
    return question


def _distractor(
    rng: random.Random,
    domain: _Domain,
    template: _Template,
    forbidden: Sequence[tuple[str, str]],
    used_entities: set[str],
    layout: str = "prose",
) -> str:
    """A passage about a new entity that mentions none of the forbidden strings (gold answers and entity).

    Without this check a distractor could accidentally state the gold value or talk about the gold entity,
    which would make the question ambiguous or give it two conflicting answers.
    """
    for _ in range(_MAX_TRIES):
        entity = domain.make_entity(rng)
        if entity in used_entities:
            continue
        text = _passage(rng, domain, template, entity, template.make_value(rng), layout)
        if not mentions(text, forbidden):
            used_entities.add(entity)
            return text
    raise RuntimeError(f"could not build a distractor for domain {domain.name!r} in {_MAX_TRIES} tries")


def _lookalike_name(rng: random.Random, entity: str, fixed_words: frozenset[str]) -> str:
    """The entity with one letter of a made-up word changed: a vowel for another vowel (a syllable's
    nucleus) or a consonant for another ("Veltrano Dynamics" -> "Veltreno Dynamics" or "Veldrano Dynamics").

    The real words of the name ("Dynamics", "Treaty of") stay, so the look-alike keeps the entity's kind.
    The length is kept, so the look-alike can never contain the gold name.
    """
    tokens = entity.split(" ")
    made_up = [i for i, t in enumerate(tokens) if t.isalpha() and t not in fixed_words]
    i = rng.choice(made_up or [i for i, t in enumerate(tokens) if t.isalpha()] or [0])
    word = tokens[i]
    vowels = [j for j, ch in enumerate(word) if ch.lower() in "aeiou"]
    consonants = [j for j, ch in enumerate(word) if ch.isalpha() and ch.lower() not in "aeiou"]
    use_vowel = vowels and (not consonants or rng.random() < 0.6)
    j = rng.choice(vowels if use_vowel else consonants)
    pool = "aeiou" if use_vowel else "bdgklmnrstvz"
    letter = rng.choice([c for c in pool if c != word[j].lower()])
    tokens[i] = word[:j] + (letter.upper() if word[j].isupper() else letter) + word[j + 1 :]
    return " ".join(tokens)


def _lookalike_distractor(
    rng: random.Random,
    domain: _Domain,
    template: _Template,
    entity: str,
    forbidden: Sequence[tuple[str, str]],
    used_entities: set[str],
    layout: str = "prose",
) -> str:
    """A same-template passage about a near-namesake of the gold entity, with another value.

    This is the confusion that matters for chunk-cache reuse: the wrong answer comes from a passage that
    looks like the right one.  The name must differ from the gold after answer normalisation.
    """
    gold = normalize_answer(entity)
    for _ in range(_MAX_TRIES):
        name = _lookalike_name(rng, entity, domain.fixed_words)
        if name in used_entities or normalize_answer(name) == gold:
            continue
        text = _passage(rng, domain, template, name, template.make_value(rng), layout)
        if not mentions(text, forbidden):
            used_entities.add(name)
            return text
    raise RuntimeError(f"could not build a look-alike of {entity!r} in {_MAX_TRIES} tries")


def _distractors(
    rng: random.Random,
    gold_domains: Sequence[_Domain],
    domain: _Domain,
    template,
    entity: str,
    value,
    layout: str,
    n_distractors: int,
    hard: bool,
    allowed: tuple[str, ...] = fam.ANSWER_TYPES,
) -> list[str]:
    """`n_distractors` passages that do not answer the question, shuffled: none names the entity or the
    answer, all share the gold passage's layout.  Other-domain passages state facts of the `allowed` answer
    types where that domain has one, so that a training record shows no held-out template even as a
    distractor."""
    forbidden = needles((*value.answers, entity))
    used = {entity}
    # Mostly same-attribute look-alikes (the hard case), about a third from other domains for realism.
    n_other = n_distractors // 3
    # Other-domain distractors come from the requested domains when there are several, so a training split
    # never shows a held-out domain's passages; a single-domain (eval) split borrows from all the others.
    others = [d for d in gold_domains if d is not domain]
    others = others or [d for d in _DOMAIN_LIST if d is not domain]
    n_same = n_distractors - n_other
    # Hard: about half of the same-template distractors (at least one, at most _MAX_LOOKALIKES) are about
    # near-namesakes of the gold entity.
    n_lookalike = min(n_same, max(1, (n_same + 1) // 2), _MAX_LOOKALIKES) if hard else 0
    # Distractors share the gold passage's layout, so that the layout is no cue.
    distractors = [
        _lookalike_distractor(rng, domain, template, entity, forbidden, used, layout)
        for _ in range(n_lookalike)
    ]
    distractors += [
        _distractor(rng, domain, template, forbidden, used, layout) for _ in range(n_same - n_lookalike)
    ]
    for _ in range(n_other):
        other = rng.choice(others)
        templates = [t for t in other.templates if t.answer_type in allowed] or other.templates
        distractors.append(_distractor(rng, other, rng.choice(templates), forbidden, used, layout))
    rng.shuffle(distractors)
    return distractors


def _record(
    rng: random.Random,
    gold_domains: Sequence[_Domain],
    contexts: int,
    answer_position: int | None,
    hard: bool = False,
    answerable: bool = True,
    sentence_answers: bool = False,
    variant: bool = False,
    choices: fam.Choices = fam.LEGACY,
    tag_family: bool = False,
) -> dict:
    """One question with its gold passage hidden among contexts - 1 distractors.

    Unanswerable: the same question over `contexts` distractors and no gold passage.  `variant` records
    (any opt-in option) carry `entity` and `answerable`; the default record has neither.
    The family is drawn from `choices`: wording and layout uniformly, the template among those of an
    allowed answer type (with the legacy choices no draw is made);
    `tag_family` records carry it.
    """
    allowed = choices.answer_types
    domain = rng.choice([d for d in gold_domains if any(t.answer_type in allowed for t in d.templates)])
    template = rng.choice([t for t in domain.templates if t.answer_type in allowed])
    entity = domain.make_entity(rng)
    value = template.make_value(rng)
    wording, layout = _pick(rng, choices.wordings), _pick(rng, choices.layouts)
    gold, fact = _passage_and_fact(rng, domain, template, entity, value, layout)

    n_distractors = contexts - 1 if answerable else contexts
    distractors = _distractors(
        rng, gold_domains, domain, template, entity, value, layout, n_distractors, hard, allowed
    )

    question = _question(template, wording, entity)
    family = {"wording": wording, "layout": layout, "answer_type": template.answer_type} if tag_family else {}
    if not answerable:
        return {
            "question": question,
            "answers": [ABSTAIN],
            "contexts": distractors,
            "domain": domain.name,
            "entity": entity,
            "answer_index": None,
            "answerable": False,
            **family,
        }
    position = rng.randrange(contexts) if answer_position is None else answer_position
    record = {
        "question": question,
        "answers": [fact, *value.answers] if sentence_answers else list(value.answers),
        "contexts": distractors[:position] + [gold] + distractors[position:],
        "domain": domain.name,
        "answer_index": position,
    }
    if variant:
        record.update(entity=entity, answerable=True)
    return {**record, **family}


def _pick(rng: random.Random, options: Sequence[str]) -> str:
    """rng.choice, without a draw when there is one option (so the legacy family leaves rng untouched)."""
    return options[0] if len(options) == 1 else rng.choice(options)


def _gold_domains(domains: Sequence[str] | None) -> list[_Domain]:
    """Resolve domain names, rejecting unknown ones so that a typo in a split does not go unnoticed."""
    by_name = _DOMAINS
    if domains is None:
        return list(by_name.values())
    names = [domains] if isinstance(domains, str) else list(domains)
    if not names:
        raise ValueError(f"domains must not be empty; choose from {', '.join(by_name)}")
    unknown = [name for name in names if name not in by_name]
    if unknown:
        known = ", ".join(by_name)
        raise ValueError(f"unknown domain(s) {', '.join(map(repr, unknown))}; choose from {known}")
    return [by_name[name] for name in names]


def generate(
    n: int,
    contexts: int,
    seed: int = 0,
    domains: Sequence[str] | None = None,
    answer_position: int | None = None,
    *,
    hard: bool = False,
    unanswerable: float = 0.0,
    sentence_answers: bool = False,
    families: str = "legacy",
) -> list[dict]:
    """Generate n QA records, each with `contexts` passages of which exactly one answers the question.

    Output is deterministic for a seed.  `domains` limits the domains of the questions and, when it names
    several, of the other-domain distractors too; `answer_position` fixes where the gold passage goes, for
    studies of position bias ("lost in the middle"), instead of a uniform random position.

    Opt-in variants for training (the default output does not change): `hard` makes about half of the
    same-template distractors (1 to 4) near-namesakes of the gold entity; `unanswerable` is the fraction
    of records (exactly round(n * unanswerable), at random positions) whose gold passage is left out, with
    answers ["The passages do not say."] and answer_index None; `sentence_answers` makes answers[0] the gold
    fact sentence (in the fact-sheet layout the asked line as a sentence, "The founder of X is Y."),
    followed by the short answers.  Records of any variant carry `entity` and `answerable`.

    `families` (families.py) chooses the template families: "legacy" (the default: direct wording, prose
    layout, any answer type), "all", "seen" (none held out) or "unseen"
    (each record with at least one held-out part, spread evenly over the held-out axes and their
    combinations).  Records of any but "legacy" also carry `wording`, `layout` and `answer_type`.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if contexts < 1:
        raise ValueError(f"contexts must be at least 1, got {contexts}")
    if answer_position is not None and not 0 <= answer_position < contexts:
        raise ValueError(f"answer_position must be in 0..{contexts - 1}, got {answer_position}")
    if not 0.0 <= unanswerable <= 1.0:
        raise ValueError(f"unanswerable must be a fraction in 0..1, got {unanswerable}")
    fam.check(families)
    gold_domains = _gold_domains(domains)
    rng = random.Random(seed)
    n_missing = round(n * unanswerable)
    missing = set(rng.sample(range(n), n_missing)) if n_missing else set()
    plan = fam.plan(families, n, rng)
    for choices in dict.fromkeys(plan):  # each distinct set of choices once, in order
        if not any(t.answer_type in choices.answer_types for d in gold_domains for t in d.templates):
            names = ", ".join(d.name for d in gold_domains)
            types = ", ".join(choices.answer_types)
            raise ValueError(f"families={families!r}: no template of domains {names} asks for a {types}")
    tagged = families != "legacy"
    variant = hard or sentence_answers or unanswerable > 0 or tagged
    return [
        _record(
            rng,
            gold_domains,
            contexts,
            answer_position,
            hard,
            i not in missing,
            sentence_answers,
            variant,
            choices,
            tagged,
        )
        for i, choices in enumerate(plan)
    ]


def write_jsonl(records: list[dict], path: str | Path) -> None:
    """Write one JSON object per line (JSONL), so that large sets can be streamed and concatenated."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
