"""Documentation layout of real-text records: presentation changes, content does not."""

import random

from turborag_research.docstyle import WIDTH, as_document, plain_question, render_passage
from turborag_research.mix import build_eval_sets, build_mix

PASSAGE = (
    "textwrap.fill(text, width=70, **kwargs)\n"
    "Fill a single paragraph of text, returning a new string. Reformat the single paragraph in 'text' "
    "to fit in lines of no more than 'width' columns, and return a new string containing the entire "
    "wrapped paragraph. As with wrap(), tabs are expanded and other whitespace characters converted "
    "to space. See TextWrapper class for available keyword args to customize wrapping behaviour."
)


def _words(text: str) -> list[str]:
    return text.split()


def test_render_keeps_every_word_and_wraps_lines():
    for seed in range(20):
        page = render_passage(PASSAGE, random.Random(seed))
        title, _, rest = page.partition("\n")
        assert title in ("# textwrap.fill", "textwrap.fill")
        header, body = PASSAGE.split("\n", 1)
        assert f"   {header}\n" in rest
        prose = rest.split(header, 1)[1]
        assert _words(prose) == _words(body)  # same words, same order: only line breaks differ
        assert "\n\n" in prose.strip()  # more than one paragraph
        assert all(len(line) <= WIDTH for line in prose.splitlines())


def test_as_document_changes_layout_only():
    record = {
        "question": "What does `textwrap.fill` do?",
        "answers": ["Fill a single paragraph of text, returning a new string."],
        "contexts": ["os.sep\nThe path separator used by the operating system, such as a slash.", PASSAGE],
        "answer_index": 1,
        "answerable": True,
        "source": "stdlib:textwrap",
    }
    questions = set()
    for seed in range(10):
        doc = as_document(record, random.Random(seed))
        assert doc["answers"] == record["answers"] and doc["answer_index"] == 1 and doc["style"] == "document"
        assert [_words(c)[-3:] for c in doc["contexts"]] == [_words(c)[-3:] for c in record["contexts"]]
        questions.add(doc["question"])
    assert questions == {record["question"], "What does textwrap.fill do?"}
    assert plain_question("Is `a` the `b`?") == "Is a the b?"


def test_mix_doc_style_share_and_default_unchanged():
    plain = build_mix(120, seed=4)
    assert plain == build_mix(120, seed=4, doc_style=0.0) and not any("style" in r for r in plain)
    styled = build_mix(120, seed=4, doc_style=1.0)
    for a, b in zip(plain, styled):  # same questions in the same order; only real text re-rendered
        assert a["answers"] == b["answers"] and a["answerable"] == b["answerable"]
        assert (b.get("style") == "document") == a["source"].startswith("stdlib")
    half = build_mix(400, seed=4, doc_style=0.5)
    real = [r for r in half if r["source"].startswith("stdlib")]
    share = sum(r.get("style") == "document" for r in real) / len(real)
    assert 0.35 < share < 0.65


def test_eval_sets_have_documentation_layout_twins():
    sets = build_eval_sets(n=20, seed=0)
    assert [r["answers"] for r in sets["realtext-doc"]] == [r["answers"] for r in sets["realtext"]]
    assert all(r["style"] == "document" for r in sets["realtext-doc"])
    assert len(sets["unanswerable-doc"]) == len(sets["unanswerable"])
