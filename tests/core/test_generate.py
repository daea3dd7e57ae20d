"""Stop handling and sampling helpers of the decoder."""

from __future__ import annotations

import pytest
import torch
from conftest import char_tokenizer

from turborag.core.generate import DecodeState, SamplingParams, TextStream, pick


def _run(text: str, **kw) -> tuple[str, str]:
    tok = char_tokenizer()
    stream = TextStream(tok, SamplingParams(**kw))
    out = ""
    for tid in tok(text, add_special_tokens=False)["input_ids"]:
        out += stream.push(tid)
        if stream.stopped:
            break
    out += stream.flush()
    return out, stream.text


def test_stop_at_newline_skips_leading_newlines():
    out, text = _run("\n\n 1987\nQuestion: more", stop_at_newline=True)
    assert out == text == "1987"  # leading whitespace is not part of the answer, streamed or not


def test_stop_string_trimmed_and_never_emitted_partially():
    out, text = _run("Ismena Throll###rest", stop=["###"])
    assert out == "Ismena Throll" and text == out


def test_no_stop_passes_everything():
    out, _ = _run("a\nb\nc")
    assert out == "a\nb\nc"


def test_pick_greedy_and_filters():
    logits = torch.tensor([0.0, 5.0, 1.0, 4.9])
    assert pick(logits, SamplingParams(), None) == 1
    g = torch.Generator().manual_seed(0)
    draws = {pick(logits, SamplingParams(temperature=1.0, top_k=2), g) for _ in range(200)}
    assert draws <= {1, 3} and len(draws) == 2
    draws = {pick(logits, SamplingParams(temperature=1.0, top_p=0.3), g) for _ in range(50)}
    assert draws == {1}


@pytest.mark.parametrize(
    "kw",
    [
        {"max_new_tokens": 0},
        {"temperature": -1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"min_tokens": -1},
        {"max_new_tokens": 4, "min_tokens": 5},
    ],
)
def test_bad_params(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


@pytest.mark.parametrize(
    "text,kw,answer",
    [
        ("  150\n", {}, "150"),
        ("\n\t 150 \n\n", {}, "150"),
        (" 1 5\n0  \n", {}, "1 5\n0"),
        ("  150  ###more", {"stop": ["###"]}, "150"),
        ("\n  150 \nQuestion: more", {"stop_at_newline": True}, "150"),
        (" \n ", {}, ""),
    ],
)
def test_deltas_concatenate_to_the_answer_text(text, kw, answer):
    """A streamed answer reads exactly like the whole one (`Answer.text`, stripped): no leading whitespace,
    no trailing whitespace either; whitespace inside the answer is kept, handed out once text follows it."""
    out, streamed = _run(text, **kw)
    assert out == streamed == answer


def test_min_tokens_defers_stop_strings_and_newlines():
    """Before min_tokens tokens, a newline or a stop string is text like any other; after, it stops."""
    out, text = _run("ab\ncd\nef", stop_at_newline=True, min_tokens=4)
    assert out == text == "ab\ncd"  # the first newline is token 3 (< 4), the second (token 6) stops
    out, _ = _run("a#b#c", stop=["#"], min_tokens=2)
    assert out == "a#b"


def test_min_tokens_picks_the_best_other_token_than_end_of_turn():
    """While fewer than min_tokens tokens are out, end-of-turn ids are masked: the runner-up is chosen."""
    tok = char_tokenizer()
    eos, other = 2, tok("x", add_special_tokens=False)["input_ids"][0]
    logits = torch.full((tok.vocab_size,), -5.0)
    logits[eos], logits[other] = 9.0, 1.0

    def state(min_tokens: int) -> DecodeState:
        params = SamplingParams(max_new_tokens=8, min_tokens=min_tokens)
        return DecodeState(tok, {eos}, params, None, logits, 0, 0.0, answer=lambda s: "done")

    assert state(0).advance() == ["done"]  # EOS ends it at once
    seq = state(3)
    for _ in range(3):
        seq.advance()
        assert not seq.finished and seq.token == other
        seq.fed(logits)
    seq.advance()
    assert seq.finished and seq.stream.ids == [other] * 3  # then EOS, as the logits say
