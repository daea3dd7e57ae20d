import pytest

from turborag.eval.metrics import contains_answer, exact_match, normalize_answer


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Quick, Brown Fox!", "quick brown fox"),
        ("  an   apple a day ", "apple day"),
        ("Dr. Ismena Throll.", "dr ismena throll"),
        ("48,200", "48200"),
        ("Theatre", "theatre"),  # articles are removed only as whole words
        ("", ""),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_contains_answer_ignores_case_punctuation_and_articles():
    assert contains_answer("It was founded by DR. ISMENA THROLL!", ["Ismena Throll"])
    assert contains_answer("The answer is the Ostrel River.", ["Ostrel River"])
    assert contains_answer("Ostrel River", ["the Ostrel River"])


def test_contains_answer_matches_whole_words_only():
    assert not contains_answer("It happened in 19990.", ["1999"])
    assert not contains_answer("It happened in 11999.", ["1999"])
    assert contains_answer("It happened in 1999.", ["1999"])
    assert not contains_answer("Throllberg", ["Throll"])


def test_contains_answer_any_of_several_answers():
    assert contains_answer("Professor Vel Arno did it", ["Ismena Throll", "Vel Arno"])
    assert not contains_answer("nobody knows", ["Ismena Throll", "Vel Arno"])


def test_exact_match_is_stricter_than_contains():
    prediction = "It was founded by Ismena Throll."
    assert contains_answer(prediction, ["Ismena Throll"])
    assert not exact_match(prediction, ["Ismena Throll"])
    assert exact_match("  ismena throll. ", ["Ismena Throll"])
    assert exact_match("The Velmora Letters", ["Velmora Letters", "other"])


@pytest.mark.parametrize("score", [contains_answer, exact_match])
def test_empty_answers_never_match(score):
    assert not score("anything at all", [])
    assert not score("anything at all", [""])
    assert not score("", ["", "  ", "the"])  # all normalise to ""
    assert score("Quorvik", ["", "Quorvik"])  # empty answers are skipped, not fatal
