"""The training mix of the cache-aware fine-tune, and the held-out sets that measure it.

One fine-tune on synthetic facts alone (uniform 1-16 passages, one-word answers) recovered accuracy on
its own kind of question but left three gaps, each closed here by a part of the mix:

- long contexts: the cache error grows with the number of re-positioned chunks, so passage counts are
  drawn with long contexts weighted up, beyond what serving usually sees: 60% uniform in 8..32 passages,
  40% uniform in 1..7 (`passage_count`);
- look-alikes: the typical turbo error is a value read from a near-identical passage, so the synthetic part
  is synth.py's `hard` variant (near-namesake entities, same template, other values);
- real text and natural answers: the standard library's documentation (realtext.py, train split) with a
  sentence as every target, so the model stops answering in one word;
- abstention: by default 15% of the questions have no answering passage (half synthetic, half real text)
  and the target "The passages do not say.", so the model learns not to take a look-alike's value;
- contrast: with `paired` a share of the unanswerable questions are twins of answerable questions of the
  same mix (`twin`): the same question over the same passages minus the one that answers it.  Independent
  unanswerable questions differ from the answerable ones in entity, wording and passages, so a model can
  learn to abstain on cues other than the missing passage; the third fine-tune abstained on only 40% of
  held-out unanswerable questions, and the probability it gave the abstention separated them from
  answerable ones poorly (ROC AUC 0.77, notes/2026-12-03-adapter-stages.md).  In a pair the missing passage
  is the only
  difference;
- documentation layout: by default half the real-text records are re-rendered as documentation pages
  (docstyle.py: a title, paragraphs, lines wrapped at 70 columns, questions without backticks), answerable
  and unanswerable alike, so that the layout of a passage is no cue for abstaining.  Without it the second
  fine-tune abstained on every demo question, whose passages are wrapped Markdown;
- topic: with `topical` a share of the unanswerable questions keep the answering passage stripped of its
  answer (topical.py), so the passages still name the entity and say other things about it.  Every other
  unanswerable question lacks the asked entity altogether, and the adapters trained on them declined
  97-98% of those but only 19-39% of RGB's en_none, whose passages are on the asked topic.

Synthetic targets are the bare value by default (`synth_answers="value"`).  The first long run trained on
the fact sentence instead (`"sentence"`): on held-out domains that model often answered with another
sentence of the right passage (the film's reviews instead of its city), because a sentence target does not
say which part of the passage the question asks for.  Real-text targets stay sentences, so answers to
real questions keep their natural length.

Template families (families.py): a synthetic record's question wording (the template's own question,
"According to the passages, ...", a fill-in-the-blank fact, an imperative "Give the founder of X."), its
passage layout (prose sentences, a fact sheet of "Attribute: value" lines, a news paragraph) and its answer
type (person, number, color, material, ...). Held-out entities and domains share the templates of training,
so they cannot show a shortcut tied to a template; so by default (`families="seen"`) the synthetic records
are drawn only from families with no held-out part (families.HELD_OUT_WORDINGS, HELD_OUT_LAYOUTS and
HELD_OUT_ANSWER_TYPES: the imperative wording, the news layout, material answers), and the eval sets
"synth-seen" and "synth-unseen" measure the gap. `families="legacy"` is the one family of the seven stages
of the shipped adapter (direct wording, prose layout, any answer type); only the synthetic records differ
between the two.

Shares: the answerable rest is split evenly between synthetic (all domains but the held-out film and
astronomy) and real text.
The held-out sets (`build_eval_sets`) use only what training never sees: the eval-split stdlib modules,
the held-out synthetic domains and the held-out template families.  Everything is deterministic for a
seed (and a Python build: the stdlib parts read its docstrings).

This code is not frozen to keep old mixes: a recipe records the sha256 of the data it builds
(`data_sha256`, recipe.py) instead, which tells when a change here makes its data no longer reproduce.
"""

from __future__ import annotations

import random

from turborag_research.docstyle import as_document, render_passage
from turborag_research.families import FAMILY_SETS
from turborag_research.prose import generate_prose, without_answer
from turborag_research.realtext import generate_realtext
from turborag_research.synth import DOMAINS, generate
from turborag_research.topical import topical_twin

HELD_OUT_DOMAINS: tuple[str, ...] = ("film", "astronomy")
TRAIN_DOMAINS: tuple[str, ...] = tuple(d for d in DOMAINS if d not in HELD_OUT_DOMAINS)

UNANSWERABLE_SHARE = 0.15  # half synthetic, half real text; the answerable rest is half each
DOC_STYLE = 0.5  # share of real-text records rendered as documentation pages
PROSE = 0.0  # share of the answerable (and of the unanswerable) records asked in plain English (prose.py)
PAIRED = 0.0  # share of the unanswerable records that are twins of answerable ones (0: all independent)
SYNTH_UNANSWERABLE = 0.5  # share of the unanswerable records (less the plain-English ones) that are synthetic
TOPICAL = 0.0  # share of the unanswerable records that keep the answering passage minus its answer
# The kind of topical record each unanswerable part becomes: stdlib real text through prose.py, whose
# answers are the sentence itself (realtext.py's default-value answers such as "0" are restated as
# "defaults to os.SEEK_SET", which no answer string matches, so its stripped passages would still answer).
_TOPICAL_OF = {
    "synth-unanswerable": "synth-topical",
    "realtext-unanswerable": "prose-topical",
    "prose-unanswerable": "prose-topical",
}
_MAX_TOPICAL_TRIES = 100
SYNTH_ANSWERS = ("value", "sentence")
LONG_SHARE = 0.6
LONG_CONTEXTS = (8, 32)
SHORT_CONTEXTS = (1, 7)
MIX_FAMILIES = tuple(f for f in FAMILY_SETS if f != "unseen")  # "legacy", "all", "seen" (the default)


def passage_count(rng: random.Random) -> int:
    """Passages for one training question: with probability LONG_SHARE uniform in 8..32, else in 1..7."""
    low, high = LONG_CONTEXTS if rng.random() < LONG_SHARE else SHORT_CONTEXTS
    return rng.randint(low, high)


def _synth(record: dict) -> dict:
    """A synth record in the mix's shape: `source` and `kind` like the real-text records."""
    return {**record, "source": f"synth:{record['domain']}", "kind": "fact"}


def _one(
    part: str, contexts: int, seed: int, synth_answers: str, doc_style: float = 0.0, families: str = "seen"
) -> dict:
    """One record of a part of the mix, from its own seed (so each record can be rebuilt alone).

    The documentation layout is drawn from a generator of its own seeded by the record's, so doc_style
    changes the layout of a record and nothing else."""
    if "-topical" in part:  # "KIND-topical", or "KIND-topical-twin" / "KIND-topical-original" of a pair
        kind, _, role = part.partition("-topical")
        return _topical(kind, contexts, seed, doc_style, families, role.removeprefix("-") or "alone")
    if part == "synth":
        sentences = synth_answers == "sentence"
        record = generate(
            1, contexts, seed, TRAIN_DOMAINS, hard=True, sentence_answers=sentences, families=families
        )[0]
        return _synth(record)
    if part == "synth-unanswerable":
        record = generate(1, contexts, seed, TRAIN_DOMAINS, hard=True, unanswerable=1.0, families=families)[0]
        return _synth(record)
    unanswerable = 0.0 if part in ("realtext", "prose") else 1.0
    if part.startswith("prose"):
        record = generate_prose(1, contexts, seed, split="train", unanswerable=unanswerable)[0]
    else:
        record = generate_realtext(1, contexts, seed, split="train", unanswerable=unanswerable)[0]
    style = random.Random(seed ^ 0xD0C5)
    return as_document(record, style) if style.random() < doc_style else record


def _topical(
    kind: str, contexts: int, seed: int, doc_style: float, families: str, role: str = "alone"
) -> dict:
    """A topical unanswerable record (topical.py) of a kind, "synth" or "prose": the twin of the answerable
    record of the first seed from `seed` on whose answering passage strips cleanly (about 19 in 20 prose
    records do, every synthetic one), laid out as the answerable records of its kind are.

    `role` "original" gives that answerable record instead, and "twin" the twin laid out exactly as its
    original (every other passage and the question as rendered there, the stripped passage rendered on its
    own): one generator renders all of a record's passages in turn, so the twin rendered afresh ("alone")
    lays out the passages after the stripped one differently from its partner."""
    for s in range(seed, seed + _MAX_TOPICAL_TRIES):
        if kind == "synth":
            record = generate(1, contexts, s, TRAIN_DOMAINS, hard=True, families=families)[0]
        else:
            record = generate_prose(1, contexts, s, split="train")[0]
        if (stripped := topical_twin(record)) is not None:
            break
    else:
        raise RuntimeError(f"no {kind} record from seed {seed} on could be stripped of its answer")
    chosen = record if role == "original" else stripped
    if kind == "synth":
        return _synth(chosen)
    style = random.Random(seed ^ 0xD0C5)
    if style.random() >= doc_style:
        return chosen
    if role != "twin":
        return as_document(chosen, style)
    document = as_document(record, style)
    i = record["answer_index"]
    contexts = list(document["contexts"])
    contexts[i] = render_passage(stripped["contexts"][i], random.Random(seed ^ 0x70B1C))
    return {**stripped, "question": document["question"], "contexts": contexts, "style": "document"}


# The answerable parts whose slot may hold the original of a topical twin of each kind.
_PARTNERS = {"synth-topical": ("synth",), "prose-topical": ("prose", "realtext")}


def _topical_pairs(draws: list[tuple[str, int, int]], paired: float, seed: int) -> list[tuple[str, int, int]]:
    """Give round(paired * topical records) of the topical records a partner: an answerable slot of the
    same kind (a real-text slot for a plain-English twin) that becomes the record the twin was made from,
    with the twin's seed and passage count.  The pair then differs only in the sentences that answer, as a
    `twin` pair differs only in the passage.  Drawn from a generator of its own.  `draws` and the result
    are (part, passages, seed) per slot."""
    rng = random.Random(seed ^ 0x7A13)
    slots = [i for i, (part, _, _) in enumerate(draws) if part in _PARTNERS]
    chosen = sorted(rng.sample(slots, round(len(slots) * paired)))
    pool = {kind: [j for j, d in enumerate(draws) if d[0] in parts] for kind, parts in _PARTNERS.items()}
    for candidates in pool.values():
        rng.shuffle(candidates)
    out = list(draws)
    for i in chosen:
        part, contexts, record_seed = draws[i]
        if pool[part]:
            out[pool[part].pop()] = (f"{part}-original", contexts, record_seed)
            out[i] = (f"{part}-twin", contexts, record_seed)
    return out


def twin(record: dict) -> dict:
    """The unanswerable twin of an answerable record: the same question over the same passages, in the same
    order and layout, without the one that answers it; the target is the abstention."""
    return {**without_answer(record), "twin": True}


def _source_kind(record: dict) -> str:
    return record["source"].split(":", 1)[0]  # "synth", "stdlib" or "prose"


def _pair(records: list[dict], paired: float, seed: int) -> list[dict]:
    """Replace round(paired * unanswerable records) of the unanswerable records by twins of answerable
    records of the same source (synthetic or real text) with at least two passages, each twinned once.
    Drawn from a generator of its own, so the twins change nothing else of the mix."""
    rng = random.Random(seed ^ 0x7A12)
    slots = [i for i, r in enumerate(records) if not r["answerable"] and not r.get("topical")]
    slots = sorted(rng.sample(slots, round(len(slots) * paired)))
    pool: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        if r["answerable"] and len(r["contexts"]) >= 2:
            pool.setdefault(_source_kind(r), []).append(i)
    for candidates in pool.values():
        rng.shuffle(candidates)
    out = list(records)
    for slot in slots:
        candidates = pool.get(_source_kind(records[slot]))
        if candidates:
            out[slot] = twin(records[candidates.pop()])
    return out


def build_mix(
    n: int,
    seed: int = 0,
    unanswerable: float = UNANSWERABLE_SHARE,
    synth_answers: str = "value",
    doc_style: float = 0.0,
    paired: float = PAIRED,
    prose: float = PROSE,
    synth_unanswerable: float = SYNTH_UNANSWERABLE,
    families: str = "seen",
    topical: float = TOPICAL,
) -> list[dict]:
    """n training records in a random order: a share `unanswerable` without an answering passage (half
    synthetic, half real text), the rest half hard synthetic (training domains; targets the value, or the
    fact sentence with synth_answers="sentence") and half stdlib real text (train split, sentence targets);
    passage counts from `passage_count`; a share `doc_style` of the real-text records in documentation
    layout (docstyle.py); a share `paired` of the unanswerable records twins of answerable ones (`twin`);
    a share `prose` of both the answerable and the unanswerable records asked in plain English about a
    sentence of stdlib documentation (prose.py), taken before the synthetic/real-text halves; a share
    `synth_unanswerable` of the other unanswerable records synthetic (floor), the rest real text; a share
    `topical` of the unanswerable records (drawn after the plan, from a generator of their own) keep the
    answering passage minus its answer (topical.py: synthetic ones stay synthetic, real-text ones are
    asked in plain English), and are never replaced by `paired` twins: with `paired` a share of them get
    an answerable partner instead, the record each was made from, in the slot of an answerable record
    of its kind (`_topical_pairs`).
    `families` sets the template families of the synthetic records (families.py): "seen" (the default)
    draws wordings and layouts uniformly among the seen ones and templates among those of a seen answer
    type; "legacy" is the one family of the shipped adapter's stages; "all" includes the held-out families
    (which makes the synth-unseen eval set meaningless).  Only the synthetic records depend on it.

    The shares are exact counts (rounded); every record has question, answers (target first), contexts,
    answer_index (None when unanswerable), answerable, source and kind.  Building 4000 takes seconds.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not 0.0 <= unanswerable <= 1.0:
        raise ValueError(f"unanswerable must be a share in [0, 1], got {unanswerable}")
    if synth_answers not in SYNTH_ANSWERS:
        raise ValueError(f"synth_answers must be one of {', '.join(SYNTH_ANSWERS)}, got {synth_answers!r}")
    if not 0.0 <= doc_style <= 1.0:
        raise ValueError(f"doc_style must be a share in [0, 1], got {doc_style}")
    if not 0.0 <= paired <= 1.0:
        raise ValueError(f"paired must be a share in [0, 1], got {paired}")
    if not 0.0 <= prose <= 1.0:
        raise ValueError(f"prose must be a share in [0, 1], got {prose}")
    if not 0.0 <= synth_unanswerable <= 1.0:
        raise ValueError(f"synth_unanswerable must be a share in [0, 1], got {synth_unanswerable}")
    if families not in MIX_FAMILIES:
        raise ValueError(f"families must be one of {', '.join(MIX_FAMILIES)}, got {families!r}")
    if not 0.0 <= topical <= 1.0:
        raise ValueError(f"topical must be a share in [0, 1], got {topical}")
    n_unanswerable = round(n * unanswerable)
    n_prose = round((n - n_unanswerable) * prose)
    n_prose_unanswerable = round(n_unanswerable * prose)
    n_synth = (n - n_unanswerable - n_prose + 1) // 2
    n_realtext = n - n_unanswerable - n_prose - n_synth
    n_rest = n_unanswerable - n_prose_unanswerable
    n_synth_unanswerable = int(n_rest * synth_unanswerable)  # floor: 0.5 gives n_rest // 2
    plan = (
        ["synth"] * n_synth
        + ["realtext"] * n_realtext
        + ["synth-unanswerable"] * n_synth_unanswerable
        + ["realtext-unanswerable"] * (n_rest - n_synth_unanswerable)
        + ["prose"] * n_prose
        + ["prose-unanswerable"] * n_prose_unanswerable
    )
    rng = random.Random(seed)
    rng.shuffle(plan)
    if topical:
        slots = [i for i, part in enumerate(plan) if part in _TOPICAL_OF]
        for i in random.Random(seed ^ 0x70B1C).sample(slots, round(len(slots) * topical)):
            plan[i] = _TOPICAL_OF[plan[i]]
    draws = []
    for part in plan:
        contexts = passage_count(rng)
        draws.append((part, contexts, rng.getrandbits(63)))
    if topical and paired:
        draws = _topical_pairs(draws, paired, seed)
    records = [_one(p, c, s, synth_answers, doc_style, families) for p, c, s in draws]
    return _pair(records, paired, seed) if paired else records


def _unanswerable_mix(rng: random.Random, n: int, contexts: int) -> list[dict]:
    """n unanswerable questions, shuffled: half hard synthetic ones from the held-out domains, half over
    eval-split real text."""
    n_synth = n // 2
    synth = []
    if n_synth:
        held_out = generate(
            n_synth, contexts, rng.getrandbits(63), HELD_OUT_DOMAINS, hard=True, unanswerable=1.0
        )
        synth = [_synth(r) for r in held_out]
    real = generate_realtext(n - n_synth, contexts, rng.getrandbits(63), split="eval", unanswerable=1.0)
    unanswerable = synth + real
    rng.shuffle(unanswerable)
    return unanswerable


def build_eval_sets(n: int = 150, contexts: int = 5, seed: int = 0) -> dict[str, list[dict]]:
    """The held-out sets, each of n questions with `contexts` passages:

    - "realtext": answerable questions over the eval-split stdlib modules (none of them is in training);
    - "unanswerable": half hard synthetic questions from the held-out domains (film, astronomy) and half
      eval-split real text, all without an answering passage, in a random order.

    - "realtext-doc" and "unanswerable-doc": the same two sets in documentation layout (docstyle.py);
    - "prose-doc": plain-English questions about sentences of eval-split stdlib documentation (prose.py),
      in documentation layout, and "prose-unanswerable-doc": the same questions without the passage that
      answers them (so one passage fewer): the abstention the missing passage alone should cause;
    - "synth-seen": answerable hard synthetic questions of the training domains in seen template families
      (families.py), about new made-up entities;
    - "synth-unseen": the same, but every question has at least one held-out part (wording, layout or
      answer type, spread evenly over the three and their combinations), over the training and the
      held-out domains;
    - "synth-topical" and "prose-topical-doc": the synth-unseen and prose-doc questions with the answering
      passage kept but stripped of the answer (topical.py), so the passages still name the entity: the
      declining RGB's en_none asks for.  A question whose passage cannot be stripped cleanly is left out
      (none of the synthetic ones, about 1 in 16 prose ones).

    Run `turborag eval` on the realtext sets for accuracy and false abstentions, on the unanswerable sets
    for the abstention rate.  A synth-seen score well above the synth-unseen one means the model learned
    shortcuts tied to the templates of training; `families.held_out_parts` and `domain` break the gap down.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if contexts < 1:
        raise ValueError(f"contexts must be at least 1, got {contexts}")
    rng = random.Random(seed)
    realtext = generate_realtext(n, contexts, rng.getrandbits(63), split="eval")
    unanswerable = _unanswerable_mix(rng, n, contexts)
    style = random.Random(seed ^ 0xD0C5)
    # Each set below draws from generators of its own, so adding a set never changes the sets above it.
    prose_style = random.Random(seed ^ 0x9805)
    raw_prose = generate_prose(n, contexts, random.Random(seed ^ 0x9805E).getrandbits(63), split="eval")
    prose = [as_document(r, prose_style) for r in raw_prose]
    topical_style = random.Random(seed ^ 0x70B1C)
    prose_twins = [t for r in raw_prose if (t := topical_twin(r)) is not None]
    seen_seed = random.Random(seed ^ 0x5EE7).getrandbits(63)
    unseen_seed = random.Random(seed ^ 0x0F5EE7).getrandbits(63)
    seen = generate(n, contexts, seen_seed, TRAIN_DOMAINS, hard=True, families="seen")
    unseen = generate(
        n, contexts, unseen_seed, TRAIN_DOMAINS + HELD_OUT_DOMAINS, hard=True, families="unseen"
    )
    return {
        "realtext": realtext,
        "unanswerable": unanswerable,
        "realtext-doc": [as_document(r, style) for r in realtext],
        "unanswerable-doc": [
            as_document(r, style) if r["source"].startswith("stdlib") else r for r in unanswerable
        ],
        "prose-doc": prose,
        "prose-unanswerable-doc": [without_answer(r) for r in prose],
        "synth-seen": [_synth(r) for r in seen],
        "synth-unseen": [_synth(r) for r in unseen],
        "synth-topical": [_synth(t) for r in unseen if (t := topical_twin(r)) is not None],
        "prose-topical-doc": [as_document(t, topical_style) for t in prose_twins],
    }
