"""The abstention threshold: the reply's probability is scored exactly, scoring leaves the cache as it was,
and a forced abstention streams, batches and ends like any answer. Tiny models in fp32."""

from __future__ import annotations

import json

import pytest
import torch

from turborag.core import hf_compat
from turborag.core.batch import DecodeBatch
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.model import abstain_threshold, adapter_dir_for
from turborag.core.options import EngineOptions
from turborag.core.prompt import ABSTAIN
from turborag.store.kv_store import KVStore

PASSAGES = [
    "Veltrano Dynamics was founded in 1911 by Ismena Throll in the city of Quorvik.",
    "The river Sallow runs through Brem, a town known for its blue bridges.",
    "Cobalt Orchard is a band from Tarsk whose first album came out in 1987.",
]
Q = "Who founded Veltrano?"
MODES = ("full", "turbo", "turbo-blend")


def _engine(lm, tmp_path, threshold):
    engine = Engine(lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(abstain_threshold=threshold))
    engine.stop_ids = set()  # random weights may pick EOS first: decode every request its full length
    return engine


@pytest.mark.parametrize("tiny_lm", ["llama", "gemma3"], indirect=True)
def test_scoring_leaves_the_answer_unchanged_below_the_threshold(tiny_lm, tmp_path):
    """Threshold 1: the reply is scored on every request but never reaches it, so every token is the one
    decoded without scoring: the scoring forward was cut back out of the cache exactly."""
    plain = _engine(tiny_lm, tmp_path / "a", None)
    scored = _engine(tiny_lm, tmp_path / "b", 1.0)
    params = SamplingParams(max_new_tokens=10)
    for mode in MODES:
        a = plain.answer(Q, PASSAGES, mode, params)
        b = scored.answer(Q, PASSAGES, mode, params)
        assert len(a.token_ids) == 10 and a.token_ids == b.token_ids, mode


@pytest.mark.parametrize("tiny_lm", ["qwen2", "gemma3"], indirect=True)
def test_abstain_logprob_equals_one_teacher_forced_forward(tiny_lm, tmp_path):
    """The reply's log-probability, read off the prefill forward, is the one a separate forward of prompt
    + reply gives; with one passage turbo has full's positions, so the same."""
    engine = _engine(tiny_lm, tmp_path, 1.0)
    prompt = engine.layout.build(Q, PASSAGES[:1])
    reply = engine.abstain_ids
    ids = torch.tensor([prompt.ids + reply])  # (1, T + R)
    cache = hf_compat.buffered_cache(tiny_lm.config.num_hidden_layers)
    with torch.no_grad():
        logits = hf_compat.forward(tiny_lm.model, ids, torch.arange(ids.shape[1])[None], cache)  # (1, T+R, V)
    logp = logits[0, len(prompt.ids) - 1 : -1].log_softmax(-1)  # (R, V): position j predicts reply[j]
    expected = logp.gather(1, torch.tensor(reply)[:, None]).sum().item()
    for mode in ("full", "turbo"):
        got = engine.answer(Q, PASSAGES[:1], mode, SamplingParams(max_new_tokens=2)).abstain_logprob
        assert got == pytest.approx(expected, abs=1e-4), mode
    unscored = engine.with_options(abstain_threshold=0)  # 0: only when greedy decoding picks the reply
    assert unscored.answer(Q, PASSAGES[:1], "full", SamplingParams(max_new_tokens=2)).abstain_logprob is None


@pytest.mark.parametrize("tiny_lm", ["gemma3"], indirect=True)
def test_reaching_the_threshold_answers_the_abstention(tiny_lm, tmp_path):
    engine = _engine(tiny_lm, tmp_path, 1e-300)  # any probability reaches it (log: -690)
    reply_text = tiny_lm.tokenizer.decode(engine.abstain_ids, skip_special_tokens=True).strip()
    assert reply_text  # the character tokenizer spells it out
    params = SamplingParams(max_new_tokens=64)
    for mode in MODES:
        deltas, answer = [], None
        for item in engine.stream(Q, PASSAGES, mode, params):
            if isinstance(item, str):
                deltas.append(item)
            else:
                answer = item
        assert answer.text == "".join(deltas) == reply_text, mode
        assert answer.token_ids == engine.abstain_ids and answer.finish_reason == "stop"
        assert answer.ttft_s > 0 and answer.mode == mode
    # too short a budget for the whole reply: cut like any answer
    short = engine.answer(Q, PASSAGES, "turbo", SamplingParams(max_new_tokens=3))
    assert short.token_ids == engine.abstain_ids[:3] and short.finish_reason == "length"


@pytest.mark.parametrize("tiny_lm", ["qwen2"], indirect=True)
def test_min_tokens_longer_than_the_reply_is_answered_by_the_model(tiny_lm, tmp_path):
    """A caller who asks for at least N tokens gets the model's answer when N is more than the fixed reply;
    up to the reply's length the threshold still declines."""
    engine = _engine(tiny_lm, tmp_path, 1e-300)
    n = len(engine.abstain_ids)
    plain = _engine(tiny_lm, tmp_path / "plain", None)
    for mode in ("full", "turbo"):
        longer = SamplingParams(max_new_tokens=n + 4, min_tokens=n + 1)
        a = engine.answer(Q, PASSAGES, mode, longer)
        assert a.token_ids == plain.answer(Q, PASSAGES, mode, longer).token_ids != engine.abstain_ids
        assert a.abstain_logprob is not None  # still scored
        same = SamplingParams(max_new_tokens=n + 4, min_tokens=n)
        assert engine.answer(Q, PASSAGES, mode, same).token_ids == engine.abstain_ids


@pytest.mark.parametrize("tiny_lm", ["llama"], indirect=True)
def test_a_forced_abstention_decodes_in_a_batch_beside_other_requests(tiny_lm, tmp_path):
    engine = _engine(tiny_lm, tmp_path, None)
    params = SamplingParams(max_new_tokens=40)  # longer than the reply (one token per character here)
    alone = [engine.answer(Q, PASSAGES[i:], "turbo", params).token_ids for i in range(2)]
    seqs = [engine.begin(Q, PASSAGES[i:], "turbo", params) for i in range(2)]
    seqs.append(engine.with_options(abstain_threshold=1e-300).begin(Q, PASSAGES, "full", params))
    batch = DecodeBatch(engine.lm.model, engine.windows)
    answers = {}
    running = list(enumerate(seqs))
    while running:
        still = []
        for i, seq in running:
            for item in seq.advance():
                if not isinstance(item, str):
                    answers[i] = item
            if not seq.finished:
                still.append((i, seq))
        running = still
        if running:
            batch.step([s for _, s in running])
    assert answers[0].token_ids == alone[0] and answers[1].token_ids == alone[1]
    assert answers[2].token_ids == engine.abstain_ids and len(engine.abstain_ids) < 40


def test_threshold_is_read_from_the_fine_tune_record(tmp_path):
    assert abstain_threshold(tmp_path) is None  # no record
    (tmp_path / "turborag_finetune.json").write_text(json.dumps({"cache_aware": True}))
    assert abstain_threshold(tmp_path) is None
    (tmp_path / "turborag_finetune.json").write_text(json.dumps({"abstain_threshold": 0.35}))
    assert abstain_threshold(tmp_path) == 0.35
    assert abstain_threshold(adapter_dir_for("gemma-3-270m-turbo")) is not None  # the shipped adapter's
    for bad in (0, -0.1, 1.5):
        (tmp_path / "turborag_finetune.json").write_text(json.dumps({"abstain_threshold": bad}))
        with pytest.raises(ValueError, match="abstain threshold"):
            abstain_threshold(tmp_path)


def test_the_reply_is_the_trained_abstention(gemma_lm, tmp_path):
    gemma_lm.answer_trained = True
    engine = _engine(gemma_lm, tmp_path, None)
    text = gemma_lm.tokenizer.decode(engine.abstain_ids, skip_special_tokens=True)
    assert text == " " + ABSTAIN  # as train/finetune.py tokenizes the target, less its newline


def test_an_untuned_chat_model_is_scored_on_its_reply_as_it_writes_it(gemma_lm, tmp_path):
    """After the chat template's model turn an untuned model writes "The ...", not " The ..."; after a
    plain "Answer:" it writes the space; a model fine-tuned on answer targets writes them as trained."""
    from turborag.core.model import answer_trained

    gemma_lm.tokenizer.chat_template = "{% for m in messages %}user: {{ m.content }}\n{% endfor %}model:\n"
    chat = _engine(gemma_lm, tmp_path / "a", None)
    assert chat.layout.template == "chat" and gemma_lm.tokenizer.decode(chat.abstain_ids) == ABSTAIN
    plain = Engine(gemma_lm, KVStore(tmp_path / "b", cache_format="float32"), EngineOptions(template="plain"))
    assert gemma_lm.tokenizer.decode(plain.abstain_ids) == " " + ABSTAIN
    record = tmp_path / "turborag_finetune.json"
    assert not answer_trained(tmp_path)
    for meta, trained in (
        ({"steps": 3}, True),
        ({"objective": "answer"}, True),
        ({"objective": "distill"}, False),
    ):
        record.write_text(json.dumps(meta))
        assert answer_trained(tmp_path) is trained
    assert answer_trained(adapter_dir_for("gemma-3-270m-turbo"))  # the shipped adapter: spaced, as trained


def test_a_newline_merged_into_the_last_word_stays_in_the_reply(gemma_lm, tmp_path):
    """Tokenizers such as Llama 3's have a ".\n" token: dropping the last token would drop the period too."""

    class Merging:  # the character tokenizer, but with "." and "\n" as one token
        def __init__(self, tok):
            self.tok = tok

        def __call__(self, text, add_special_tokens=True):
            ids = self.tok(text.replace(".\n", "."), add_special_tokens=add_special_tokens)["input_ids"]
            return {"input_ids": ids}

        def decode(self, ids, **kwargs):
            return self.tok.decode(ids, **kwargs)

        def __getattr__(self, name):
            return getattr(self.tok, name)

    gemma_lm.answer_trained = True  # the reply with its target's newline, which may be merged
    plain = _engine(gemma_lm, tmp_path / "a", None)
    gemma_lm.tokenizer = Merging(gemma_lm.tokenizer)
    merged = _engine(gemma_lm, tmp_path / "b", None)
    assert merged.abstain_ids == plain.abstain_ids  # the same reply, its period kept
