"""Real passages and questions for the query-side distillation adapter, built from SQuAD v1.1.

The query-side adapter is trained to make the cache-reusing reader answer as the same model does when it
reads all of a question's passages in one ordinary forward (the teacher).  The teacher needs no gold
labels, but its student must see what retrieval really returns: encyclopaedic prose from several unrelated
documents, one of which answers.  The synthetic and stdlib generators (synth.py, realtext.py) give templated
or documentation-shaped text; SQuAD's Wikipedia paragraphs and crowd-written questions give the real thing.
The gold answers are kept anyway, so that held-out accuracy can be measured with `turborag eval`.

A record is one SQuAD question with k passages (4 by default): its own paragraph, optionally one more
paragraph of the same article (a near-topic distractor, the hard case for a reader whose passages were
encoded apart), and paragraphs of other articles, in a seeded random order.  Every paragraph is capped at
about 120 words, cut at a sentence end, so that a record stays near 500 words; a question is kept only if an
answer still appears in its capped paragraph, and its answers are the dataset's answer texts that do
(deduplicated).  No distractor mentions any answer (`text.mentions`), so exactly one passage answers.

Articles are split once, by a seeded shuffle of their titles, into training and held-out evaluation
articles, and every passage of a record (distractors included) comes from its question's split: no article
appears in both files.  Output is deterministic for a raw file and a seed.

    python -m turborag_research.distill_data dev-v1.1.json --out-dir DIR --train 600 --eval 150 --seed 0
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from turborag_research.text import SENTENCE_END, mentions, needles

MAX_WORDS = 120
K = 4
EVAL_FRACTION = 0.2

# A period that SENTENCE_END takes for a sentence end but that Wikipedia prose uses inside sentences: an
# initial ("John F. Kennedy", "U.S. Army") or a short title or abbreviation ("St. Louis", "No. 1").
_NOT_AN_END = re.compile(
    r"(?:\b(?:[A-Z]\.)+|\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|Mt|Ft|No|Nos|vs|Inc|Co|Ltd|Gen|Col|Lt|Capt|Gov|Sen|Rep|Rev"
    r"|Prof|Jan|Feb|Aug|Sept|Oct|Nov|Dec|approx|ca|c)\.)$"
)


@dataclass(frozen=True)
class Question:
    """One answerable question with the (capped) paragraph that answers it."""

    id: str
    question: str
    answers: list[str]
    paragraph: int  # index into Article.paragraphs


@dataclass(frozen=True)
class Article:
    """One SQuAD article: its title, capped paragraphs and the questions they still answer."""

    title: str
    paragraphs: list[str]
    questions: list[Question]


def sentences(text: str) -> list[str]:
    """The sentences of whitespace-normalised prose: `SENTENCE_END`, less its breaks after an initial or an
    abbreviation (`_NOT_AN_END`), which would otherwise leave a capped passage ending in "Christopher J."."""
    out: list[str] = []
    for piece in SENTENCE_END.split(" ".join(text.split())):
        if out and _NOT_AN_END.search(out[-1]):
            out[-1] = f"{out[-1]} {piece}"
        else:
            out.append(piece)
    return out


def cap_words(text: str, max_words: int = MAX_WORDS) -> str:
    """The longest run of whole leading sentences that has at most `max_words` words.

    Cutting at a sentence end keeps every passage readable prose, as a retrieved chunk would be; a first
    sentence longer than the cap is kept whole rather than cut mid-sentence.
    """
    parts = sentences(text)
    kept, words = [parts[0]], len(parts[0].split())
    for sentence in parts[1:]:
        words += len(sentence.split())
        if words > max_words:
            break
        kept.append(sentence)
    return " ".join(kept)


def _dedup(strings: Sequence[str]) -> list[str]:
    """The strings in first-seen order, each once."""
    return list(dict.fromkeys(strings))


def load_squad(path: str | Path, max_words: int = MAX_WORDS) -> tuple[str, list[Article]]:
    """Read a SQuAD-format JSON file into (version, articles) with capped paragraphs.

    A question is kept only if at least one of its answer texts still appears in its capped paragraph, and
    only those answers are kept: every gold answer is then a span of a passage the reader sees.
    Unanswerable SQuAD v2.0 questions have no answer text and are dropped the same way.
    """
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    articles = []
    for entry in raw["data"]:
        paragraphs: list[str] = []
        questions: list[Question] = []
        for para in entry["paragraphs"]:
            capped = cap_words(para["context"], max_words)
            if capped in paragraphs:
                continue  # a repeated paragraph would make two answering passages
            paragraphs.append(capped)
            for qa in para["qas"]:
                texts = _dedup(" ".join(a["text"].split()) for a in qa.get("answers", []))
                present = [t for t in texts if t and t in capped]
                if present and qa["question"].strip():
                    questions.append(Question(qa["id"], qa["question"].strip(), present, len(paragraphs) - 1))
        articles.append(Article(entry["title"], paragraphs, questions))
    return str(raw.get("version", "")), articles


def split_articles(
    articles: Sequence[Article], eval_fraction: float = EVAL_FRACTION, seed: int = 0
) -> tuple[list[Article], list[Article]]:
    """(train, eval) articles: a seeded shuffle of the sorted titles, the first `eval_fraction` held out.

    Splitting by article rather than by question keeps the held-out set honest: an eval question never asks
    about a paragraph, or even a topic, that training saw.
    """
    titles = sorted({a.title for a in articles})
    random.Random(seed).shuffle(titles)
    n_eval = max(1, round(len(titles) * eval_fraction))
    held_out = set(titles[:n_eval])
    return [a for a in articles if a.title not in held_out], [a for a in articles if a.title in held_out]


def _distractors(
    rng: random.Random,
    pool: Sequence[tuple[int, str]],
    count: int,
    exclude_article: int,
    answers: Sequence[tuple[str, str]],
) -> list[str] | None:
    """`count` paragraphs of `pool` (article index, text) outside `exclude_article` that mention no answer."""
    picked: list[str] = []
    if count == 0:
        return picked
    for i in rng.sample(range(len(pool)), len(pool)):
        article, text = pool[i]
        if article != exclude_article and not mentions(text, answers):
            picked.append(text)
            if len(picked) == count:
                return picked
    return None


def build_records(
    articles: Sequence[Article],
    n: int,
    k: int = K,
    near: int = 1,
    seed: int = 0,
    version: str = "1.1",
) -> list[dict]:
    """`n` records from `articles`, each one question with k passages, distractors from these articles only.

    Questions are drawn uniformly (seeded) without repetition; a question for which too few distractors
    avoid its answers is skipped.  Up to `near` of the k-1 distractors are other paragraphs of the question's
    own article that mention no answer: the hard case, passages on one subject whose names, dates and figures
    differ, as a news search returns several reports of one event.  Raises ValueError if fewer than `n` fit.
    """
    if k < 2:
        raise ValueError("k must be at least 2: the answering paragraph and a distractor")
    rng = random.Random(seed)
    pool = [(ai, p) for ai, a in enumerate(articles) for p in a.paragraphs]
    candidates = [(ai, q) for ai, a in enumerate(articles) for q in a.questions]
    rng.shuffle(candidates)
    records = []
    for ai, q in candidates:
        article = articles[ai]
        gold = article.paragraphs[q.paragraph]
        answer_needles = needles(q.answers)
        siblings = [p for i, p in enumerate(article.paragraphs) if i != q.paragraph]
        near_ones = [p for p in rng.sample(siblings, len(siblings)) if not mentions(p, answer_needles)]
        near_ones = near_ones[: min(near, k - 1)]
        far = _distractors(rng, pool, k - 1 - len(near_ones), ai, answer_needles)
        if far is None:
            continue
        contexts = [gold, *near_ones, *far]
        rng.shuffle(contexts)
        records.append(
            {
                "question": q.question,
                "contexts": contexts,
                "answers": q.answers,
                "source": f"squad-v{version}:{article.title}",
                "id": q.id,
                "answer_index": contexts.index(gold),
            }
        )
        if len(records) == n:
            return records
    raise ValueError(f"only {len(records)} of {n} records fit these {len(articles)} articles")


def build_splits(
    path: str | Path,
    n_train: int,
    n_eval: int,
    k: int = K,
    seed: int = 0,
    near: int = 1,
    max_words: int = MAX_WORDS,
    eval_fraction: float = EVAL_FRACTION,
) -> tuple[list[dict], list[dict]]:
    """(train, eval) records from a raw SQuAD file, split by article; deterministic for a seed."""
    version, articles = load_squad(path, max_words)
    train_articles, eval_articles = split_articles(articles, eval_fraction, seed)
    train = build_records(train_articles, n_train, k, near, seed, version)
    held_out = build_records(eval_articles, n_eval, k, near, seed + 1, version)
    return train, held_out


def write_jsonl(records: Sequence[dict], path: Path) -> None:
    """One JSON object a line, UTF-8 unescaped (the passages are real prose, some of it not ASCII)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw", type=Path, help="a SQuAD-format JSON file (dev-v1.1.json)")
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--train", type=int, default=600, help="training records")
    p.add_argument("--eval", type=int, default=150, help="held-out records")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-k", type=int, default=K, help="passages per record")
    p.add_argument("--max-words", type=int, default=MAX_WORDS, help="cap of a paragraph, cut at a sentence")
    p.add_argument("--eval-fraction", type=float, default=EVAL_FRACTION, help="share of articles held out")
    p.add_argument("--near", type=int, default=1, help="most distractors from its own article")
    p.add_argument("--prefix", default="distill", help="writes PREFIX_train.jsonl, PREFIX_eval.jsonl")
    a = p.parse_args(argv)
    train, held_out = build_splits(a.raw, a.train, a.eval, a.k, a.seed, a.near, a.max_words, a.eval_fraction)
    for name, records in ((f"{a.prefix}_train.jsonl", train), (f"{a.prefix}_eval.jsonl", held_out)):
        out = a.out_dir / name
        write_jsonl(records, out)
        titles = {r["source"] for r in records}
        print(f"{out}: {len(records)} records from {len(titles)} articles")


if __name__ == "__main__":
    main()
