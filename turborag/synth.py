"""Synthetic multi-document QA over invented facts.

A retrieval-augmented reader has to be evaluated on questions that only the given passages can answer;
otherwise a model that memorised the answer during pretraining looks like a good reader.  Every entity and
value here is built from random syllables, so the gold passage is the only place the answer can come from.
The distractors are made to look as much like the gold passage as possible (same domain, same attribute,
other entities with other values), plus a few from other domains, so that a model has to read the right
passage instead of copying the first plausible value it sees.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from turborag.metrics import normalize_answer

# Passages get filler sentences up to this length, so that they look like ordinary retrieved chunks.
_MIN_WORDS = 40
_MAX_SENTENCES = 4
# Distractors are redrawn when they happen to mention the gold answer or entity; this bounds the redraws.
_MAX_TRIES = 200


@dataclass(frozen=True)
class _Value:
    """An attribute value: how the passage writes it, and the answer strings that count as correct."""

    text: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class _Template:
    """One attribute of a domain: the question, the ways of stating the fact, and how to invent a value."""

    attribute: str
    question: str  # formatted with e=entity
    facts: tuple[str, ...]  # formatted with e=entity, v=value text
    make_value: Callable[[random.Random], _Value]


@dataclass(frozen=True)
class _Domain:
    """A kind of entity, its attributes, and filler sentences that say nothing about those attributes."""

    name: str
    make_entity: Callable[[random.Random], str]
    templates: tuple[_Template, ...]
    fillers: tuple[str, ...]  # formatted with e=entity


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


def _film_title(rng: random.Random) -> str:
    """A made-up film title such as "The Velmora Inheritance"."""
    return f"The {_word(rng)} {rng.choice(('Inheritance', 'Affair', 'Protocol', 'Covenant', 'Horizon'))}"


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

    def make(rng: random.Random) -> _Value:
        text = rng.choice(patterns).format(w=_word(rng))
        return _Value(text, (text,))

    return make


def _number(low: int, high: int, step: int = 1) -> Callable[[random.Random], _Value]:
    """A number written as digits, which is how a reader is expected to answer it."""

    def make(rng: random.Random) -> _Value:
        text = str(rng.randint(low // step, high // step) * step)
        return _Value(text, (text,))

    return make


def _color(rng: random.Random) -> _Value:
    """A color word; the small set makes same-attribute distractors frequent and the task harder."""
    color = rng.choice(_COLORS)
    return _Value(color, (color,))


# --- domains ---------------------------------------------------------------------------------------------

_YEAR = _number(1650, 2015)

_DOMAIN_LIST = (
    _Domain(
        "company",
        _with_suffix(
            "Dynamics",
            "Systems",
            "Holdings",
            "Labs",
            "Industries",
            "Logistics",
            "Robotics",
            "Textiles",
            "Analytics",
        ),
        (
            _Template(
                "founder",
                "Who founded {e}?",
                (
                    "{e} was founded by {v}, who still sits on its advisory board.",
                    "The company {e} was started by {v} in a rented workshop.",
                ),
                _person("Dr.", "Professor"),
            ),
            _Template(
                "headquarters",
                "In which city is {e} headquartered?",
                (
                    "{e} has its headquarters in the city of {v}.",
                    "The main offices of {e} are located in {v}, close to the central station.",
                ),
                _name,
            ),
            _Template(
                "year founded",
                "In what year was {e} founded?",
                (
                    "{e} was founded in {v}.",
                    "{e} opened its first office in {v} with only a handful of employees.",
                ),
                _YEAR,
            ),
            _Template(
                "product",
                "What is the flagship product of {e}?",
                (
                    "The best-selling product of {e} is a device called the {v}.",
                    "{e} is best known for its flagship product, the {v}.",
                ),
                _name,
            ),
        ),
        (
            "{e} employs engineers, designers and sales staff spread across several regional offices.",
            "Analysts often describe {e} as a careful company that prefers slow growth to risky deals.",
            "In recent years {e} has invested heavily in training programmes for its younger employees.",
            "Customers tend to praise {e} for its reliable support service and its honest advertising.",
            "The annual report of {e} highlights a steady rise in export sales over the last decade.",
            "{e} publishes a short newsletter for its suppliers and shareholders every spring.",
            "Critics have occasionally accused {e} of moving too cautiously into new markets.",
        ),
    ),
    _Domain(
        "city",
        _word,
        (
            _Template(
                "mayor",
                "Who is the mayor of {e}?",
                (
                    "The current mayor of {e} is {v}.",
                    "{v} was elected mayor of {e} after a closely fought campaign.",
                ),
                _person(),
            ),
            _Template(
                "river",
                "Which river flows through {e}?",
                ("The {v} flows through the center of {e}.", "{e} was built on both banks of the {v}."),
                _landmark("River"),
            ),
            _Template(
                "population",
                "What is the population of {e}?",
                (
                    "{e} has a population of {v} people.",
                    "According to the latest census, {v} people live in {e}.",
                ),
                _number(12000, 990000, step=100),
            ),
            _Template(
                "landmark",
                "What is the best-known landmark in {e}?",
                (
                    "The best-known landmark in {e} is the {v}.",
                    "Visitors to {e} usually head first to its most famous landmark, the {v}.",
                ),
                _named("Bridge", "Tower", "Cathedral", "Gate", "Lighthouse"),
            ),
        ),
        (
            "{e} is known for its narrow cobbled streets and its busy weekend markets.",
            "Many residents of {e} commute by tram, and the old railway station is still in use.",
            "Every autumn {e} hosts a lantern festival that draws visitors from the surrounding villages.",
            "The local council of {e} has recently expanded the public library and several parks.",
            "Tourists often remark on the quiet cafes and carefully restored facades of {e}.",
            "The economy of {e} relies on small workshops, a modest harbour and a growing university.",
            "Winters in {e} are mild, and the summers bring long evenings by the water.",
        ),
    ),
    _Domain(
        "chemistry",
        _compound,
        (
            _Template(
                "discoverer",
                "Who first synthesized {e}?",
                (
                    "{e} was first synthesized by {v} in a university laboratory.",
                    "The first sample of {e} was prepared by {v}.",
                ),
                _person("Dr.", "Professor"),
            ),
            _Template(
                "melting point",
                "At what temperature, in degrees Celsius, does {e} melt?",
                ("{e} melts at {v} degrees Celsius.", "Pure {e} has a melting point of {v} degrees Celsius."),
                _number(40, 1800),
            ),
            _Template(
                "crystal color",
                "What color are crystals of {e}?",
                ("Crystals of {e} have a distinctive {v} color.", "When purified, {e} forms {v} crystals."),
                _color,
            ),
            _Template(
                "year isolated",
                "In what year was {e} first isolated?",
                ("{e} was first isolated in {v}.", "Chemists first isolated {e} in {v}."),
                _YEAR,
            ),
        ),
        (
            "{e} is stable at room temperature but reacts slowly when exposed to moist air.",
            "Small amounts of {e} are used as a catalyst in several industrial processes.",
            "Safety guidelines recommend storing {e} in sealed glass containers away from direct sunlight.",
            "Researchers are still debating the exact mechanism by which {e} binds to metal surfaces.",
            "{e} dissolves readily in alcohol but hardly at all in water, which simplifies its purification.",
            "Because it is expensive to produce, {e} is mostly studied in academic laboratories.",
            "Several patents describe methods for producing {e} on a larger scale.",
        ),
    ),
    _Domain(
        "music",
        _with_suffix("Collective", "Quartet", "Ensemble", "Assembly", "Brothers", "Orchestra"),
        (
            _Template(
                "lead singer",
                "Who is the lead singer of the {e}?",
                (
                    "The lead singer of the {e} is {v}.",
                    "{v} has been the lead vocalist of the {e} since their first concert.",
                ),
                _person(),
            ),
            _Template(
                "debut album",
                "What was the title of the debut album by the {e}?",
                (
                    "The debut album of the {e} was titled {v}.",
                    "The {e} released their first album, {v}, to warm reviews.",
                ),
                _title("{w} Nights", "Songs of {w}", "Echoes of {w}", "Letters from {w}"),
            ),
            _Template(
                "hometown",
                "In which city were the {e} formed?",
                ("The {e} were formed in the city of {v}.", "The members of the {e} met as students in {v}."),
                _name,
            ),
        ),
        (
            "The {e} are known for long live performances that mix folk melodies with electronic rhythms.",
            "Critics have praised the {e} for their careful arrangements and unusual choice of instruments.",
            "The {e} tour mostly in small venues and rarely give interviews.",
            "Fans of the {e} often trade recordings of their concerts online.",
            "Over the years the {e} have changed their line-up several times without losing their sound.",
            "Several songs by the {e} have been used in independent films and radio dramas.",
        ),
    ),
    _Domain(
        "sports",
        _with_suffix("Falcons", "Wolves", "Comets", "Herons", "Badgers", "Mariners", "Foxes", "Rangers"),
        (
            _Template(
                "coach",
                "Who is the head coach of the {e}?",
                ("The {e} are coached by {v}.", "{v} took over as head coach of the {e} two seasons ago."),
                _person(),
            ),
            _Template(
                "stadium",
                "What is the name of the home stadium of the {e}?",
                (
                    "The {e} play their home games at {v}.",
                    "Home matches of the {e} take place at {v}, which is always sold out.",
                ),
                _named("Arena", "Park", "Stadium", "Field"),
            ),
            _Template(
                "league titles",
                "How many league titles have the {e} won?",
                (
                    "The {e} have won {v} league titles in their history.",
                    "So far the {e} have collected {v} league championships.",
                ),
                _number(2, 19),
            ),
            _Template(
                "year founded",
                "In what year were the {e} founded?",
                ("The {e} were founded in {v}.", "The club known as the {e} was established in {v}."),
                _number(1860, 2015),
            ),
        ),
        (
            "The {e} are famous for their loyal supporters, who sing throughout every home game.",
            "Young players often join the {e} through the club's own training academy.",
            "The {e} favour a fast, attacking style that makes their matches popular on television.",
            "Local newspapers cover every transfer rumour involving the {e} in great detail.",
            "The rivalry between the {e} and their closest neighbours is one of the oldest in the league.",
            "Supporters of the {e} traditionally wear scarves in the club colours on match days.",
        ),
    ),
    _Domain(
        "astronomy",
        _with_suffix("Prime", "Major", "Minor", "Secundus", "Tertius"),
        (
            _Template(
                "discoverer",
                "Who discovered the exoplanet {e}?",
                (
                    "The exoplanet {e} was discovered by {v}.",
                    "{v} announced the discovery of the exoplanet {e} after months of observations.",
                ),
                _person("Dr.", "Professor"),
            ),
            _Template(
                "host star",
                "Which star does {e} orbit?",
                ("{e} orbits the star {v}.", "The host star of {e} is a dim dwarf called {v}."),
                _name,
            ),
            _Template(
                "orbital period",
                "How many days does {e} take to complete one orbit?",
                ("{e} completes one orbit around its star every {v} days.", "A year on {e} lasts {v} days."),
                _number(3, 900),
            ),
        ),
        (
            "{e} is thought to have a thick atmosphere rich in clouds of ice and dust.",
            "Astronomers study {e} because its surface temperature may allow liquid water.",
            "{e} is hard to observe because it is faint and often lost in the surrounding glare.",
            "Future space telescopes are expected to measure the chemical makeup of {e} in greater detail.",
            "Computer models suggest that {e} formed far from its current orbit and later migrated inward.",
            "{e} is slightly larger than Earth, and its gravity is estimated to be noticeably stronger.",
        ),
    ),
    _Domain(
        "cooking",
        _with_suffix("stew", "pie", "broth", "flatbread", "casserole", "tart", "porridge"),
        (
            _Template(
                "origin",
                "In which town did {e} originate?",
                ("{e} originated in the town of {v}.", "Food historians trace {e} back to the town of {v}."),
                _name,
            ),
            _Template(
                "main ingredient",
                "What is the main ingredient of {e}?",
                (
                    "The main ingredient of {e} is {v}.",
                    "{e} is made mostly from {v}, cooked slowly with onions.",
                ),
                _named("root", "berries", "beans", "mushrooms", "leaves"),
            ),
            _Template(
                "creator",
                "Which chef created {e}?",
                ("{e} was created by {v}.", "{v} invented {e} for a royal banquet."),
                _person("Chef"),
            ),
            _Template(
                "cooking time",
                "For how many minutes is {e} traditionally cooked?",
                (
                    "{e} is traditionally cooked for {v} minutes.",
                    "Traditional recipes say that {e} should cook for {v} minutes.",
                ),
                _number(15, 240),
            ),
        ),
        (
            "{e} is usually served at family gatherings and seasonal festivals.",
            "Many restaurants offer their own version of {e}, often with a secret blend of spices.",
            "{e} tastes best when it is eaten warm with fresh bread and a glass of cider.",
            "Cookbooks disagree about whether {e} should be seasoned before or after cooking.",
            "Leftover {e} is said to taste even better on the following day.",
            "In recent years {e} has become popular with street food vendors in larger cities.",
        ),
    ),
    _Domain(
        "history",
        _with_prefix("Treaty of", "Accord of", "Peace of"),
        (
            _Template(
                "year signed",
                "In what year was the {e} signed?",
                ("The {e} was signed in {v}.", "Delegates finally signed the {e} in {v}."),
                _number(1200, 1900),
            ),
            _Template(
                "negotiator",
                "Who negotiated the {e}?",
                ("The {e} was negotiated by {v}.", "{v} led the negotiations that produced the {e}."),
                _person("Lord", "Count"),
            ),
            _Template(
                "border river",
                "Which river became the border under the {e}?",
                (
                    "Under the {e}, the {v} became the new border between the two kingdoms.",
                    "The {e} fixed the border along the {v}.",
                ),
                _landmark("River"),
            ),
        ),
        (
            "The {e} ended years of costly skirmishes between two neighbouring kingdoms.",
            "Historians still debate whether the {e} was a genuine compromise or a forced surrender.",
            "Copies of the {e} were read aloud in market squares so that ordinary people learned its terms.",
            "The {e} also settled a long dispute over fishing rights and trade tariffs.",
            "Several clauses of the {e} were quietly ignored within a generation.",
            "The original parchment of the {e} is kept in a national archive and rarely shown to the public.",
        ),
    ),
    _Domain(
        "biology",
        _with_suffix("moth", "beetle", "frog", "finch", "lizard", "salamander", "snail"),
        (
            _Template(
                "describer",
                "Who first described the {e}?",
                (
                    "The {e} was first described by {v}.",
                    "{v} gave the first scientific description of the {e}.",
                ),
                _person("Dr.", "Professor"),
            ),
            _Template(
                "island",
                "On which island is the {e} found?",
                ("The {e} is found only on {v}.", "The only known population of the {e} lives on {v}."),
                _landmark("Island"),
            ),
            _Template(
                "color",
                "What color is the {e}?",
                (
                    "The {e} is easily recognised by its {v} coloring.",
                    "Adult specimens of the {e} are a striking {v}.",
                ),
                _color,
            ),
            _Template(
                "lifespan",
                "How many years does the {e} typically live?",
                (
                    "The {e} typically lives for about {v} years.",
                    "In the wild the {e} can reach an age of {v} years.",
                ),
                _number(2, 40),
            ),
        ),
        (
            "The {e} is most active during the early morning and late evening.",
            "Conservation groups monitor the {e} closely because its habitat is shrinking.",
            "The {e} feeds on a varied diet that changes with the seasons.",
            "Field researchers often need several days of patient searching to spot the {e}.",
            "The {e} plays an important role in spreading the seeds of local plants.",
            "Little is known about how the {e} survives the long dry season.",
        ),
    ),
    _Domain(
        "film",
        _film_title,
        (
            _Template(
                "director",
                "Who directed {e}?",
                ("{e} was directed by {v}.", "{v} directed {e} on a modest budget."),
                _person(),
            ),
            _Template(
                "release year",
                "In what year was {e} released?",
                ("{e} was released in {v}.", "{e} first reached cinemas in {v}."),
                _number(1920, 2015),
            ),
            _Template(
                "lead actor",
                "Who played the lead role in {e}?",
                ("The lead role in {e} was played by {v}.", "{v} starred in the lead role of {e}."),
                _person(),
            ),
            _Template(
                "filming location",
                "In which city was {e} filmed?",
                ("{e} was filmed on location in {v}.", "Most scenes of {e} were shot in the city of {v}."),
                _name,
            ),
        ),
        (
            "{e} received mixed reviews at first but later gained a loyal following.",
            "The soundtrack of {e} relies on sparse piano themes and long silences.",
            "{e} runs for a little over two hours and is told mostly in flashbacks.",
            "Film students often analyse the long opening shot of {e}.",
            "{e} was nominated for several awards at international festivals.",
            "Critics admired the cinematography of {e} more than its slow-moving plot.",
        ),
    ),
)

_DOMAINS = {domain.name: domain for domain in _DOMAIN_LIST}
DOMAINS: tuple[str, ...] = tuple(_DOMAINS)


# --- passages and records --------------------------------------------------------------------------------


def _sentence(template: str, **fields: str) -> str:
    """Fill a sentence template and capitalise it, since entities like "the Velmari moth" may come first."""
    text = template.format(**fields)
    return text[0].upper() + text[1:]


def _passage(rng: random.Random, domain: _Domain, template: _Template, entity: str, value: _Value) -> str:
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
    return " ".join(fillers[:position] + [fact] + fillers[position:])


def _needles(strings: Sequence[str]) -> list[tuple[str, str]]:
    """Prepare strings for `_mentions`: raw lower-case and space-padded normalised form (empty if none)."""
    needles = []
    for string in strings:
        normalized = normalize_answer(string)
        needles.append((string.lower(), f" {normalized} " if normalized else ""))
    return needles


def _mentions(text: str, needles: Sequence[tuple[str, str]]) -> bool:
    """True if the text contains any needle, raw (case-insensitive) or as normalised whole words.

    Both checks are needed: the raw one catches "1987" inside "19870", the normalised one catches
    "The Velmora Letters" written as "a Velmora Letters".
    """
    lowered = text.lower()
    padded = f" {normalize_answer(text)} "
    return any(raw in lowered or (norm and norm in padded) for raw, norm in needles)


def _distractor(
    rng: random.Random,
    domain: _Domain,
    template: _Template,
    forbidden: Sequence[tuple[str, str]],
    used_entities: set[str],
) -> str:
    """A passage about a new entity that mentions none of the forbidden strings (gold answers and entity).

    Without this check a distractor could accidentally state the gold value or talk about the gold entity,
    which would make the question ambiguous or give it two conflicting answers.
    """
    for _ in range(_MAX_TRIES):
        entity = domain.make_entity(rng)
        if entity in used_entities:
            continue
        text = _passage(rng, domain, template, entity, template.make_value(rng))
        if not _mentions(text, forbidden):
            used_entities.add(entity)
            return text
    raise RuntimeError(f"could not build a distractor for domain {domain.name!r} in {_MAX_TRIES} tries")


def _record(
    rng: random.Random, gold_domains: Sequence[_Domain], contexts: int, answer_position: int | None
) -> dict:
    """One question with its gold passage hidden among contexts - 1 distractors."""
    domain = rng.choice(gold_domains)
    template = rng.choice(domain.templates)
    entity = domain.make_entity(rng)
    value = template.make_value(rng)
    gold = _passage(rng, domain, template, entity, value)

    forbidden = _needles((*value.answers, entity))
    used = {entity}
    n_distractors = contexts - 1
    # Mostly same-attribute look-alikes (the hard case), about a third from other domains for realism.
    n_other = n_distractors // 3
    # Other-domain distractors come from the requested domains when there are several, so a training split
    # never shows a held-out domain's passages; a single-domain (eval) split borrows from all the others.
    others = [d for d in gold_domains if d is not domain] or [d for d in _DOMAIN_LIST if d is not domain]
    distractors = [
        _distractor(rng, domain, template, forbidden, used) for _ in range(n_distractors - n_other)
    ]
    for _ in range(n_other):
        other = rng.choice(others)
        distractors.append(_distractor(rng, other, rng.choice(other.templates), forbidden, used))
    rng.shuffle(distractors)

    position = rng.randrange(contexts) if answer_position is None else answer_position
    return {
        "question": template.question.format(e=entity),
        "answers": list(value.answers),
        "contexts": distractors[:position] + [gold] + distractors[position:],
        "domain": domain.name,
        "answer_index": position,
    }


def _gold_domains(domains: Sequence[str] | None) -> list[_Domain]:
    """Resolve domain names, rejecting unknown ones so that a typo in a split does not go unnoticed."""
    if domains is None:
        return list(_DOMAIN_LIST)
    names = [domains] if isinstance(domains, str) else list(domains)
    if not names:
        raise ValueError(f"domains must not be empty; choose from {', '.join(DOMAINS)}")
    unknown = [name for name in names if name not in _DOMAINS]
    if unknown:
        known = ", ".join(DOMAINS)
        raise ValueError(f"unknown domain(s) {', '.join(map(repr, unknown))}; choose from {known}")
    return [_DOMAINS[name] for name in names]


def generate(
    n: int,
    contexts: int,
    seed: int = 0,
    domains: Sequence[str] | None = None,
    answer_position: int | None = None,
) -> list[dict]:
    """Generate n QA records, each with `contexts` passages of which exactly one answers the question.

    Output is deterministic for a seed.  `domains` limits the domains of the questions and, when it names
    several, of the other-domain distractors too; `answer_position` fixes where the gold passage goes, for
    studies of position bias ("lost in the middle"), instead of a uniform random position.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if contexts < 1:
        raise ValueError(f"contexts must be at least 1, got {contexts}")
    if answer_position is not None and not 0 <= answer_position < contexts:
        raise ValueError(f"answer_position must be in 0..{contexts - 1}, got {answer_position}")
    gold_domains = _gold_domains(domains)
    rng = random.Random(seed)
    return [_record(rng, gold_domains, contexts, answer_position) for _ in range(n)]


def write_jsonl(records: list[dict], path: str | Path) -> None:
    """Write one JSON object per line (JSONL), so that large sets can be streamed and concatenated."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
