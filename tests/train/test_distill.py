"""Self-distillation on a tiny model: the loss falls, turbo's logits move toward full's, and a query-side
adapter leaves the context to the base."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import COMMON, char_tokenizer
from transformers import Qwen2Config, Qwen2ForCausalLM

from turborag.core import query_adapter
from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams
from turborag.core.model import load_model
from turborag.store.kv_store import KVStore
from turborag.train.distill import Teacher, TeacherFile, distill_loss
from turborag.train.finetune import TrainConfig, check_config, finetune

EXAMPLES = [
    {
        "question": "Who founded Veltrano?",
        "contexts": [
            "Veltrano was founded by Ismena Throll.",
            "The Sallow runs through Brem.",
            "Oaks are old.",
        ],
        "answers": ["unused"],
    },
    {
        "question": "Where does the Sallow run?",
        "contexts": ["Cobalt Orchard sings at dusk.", "The Sallow runs through Brem.", "Veltrano is a city."],
        "answers": ["unused"],
    },
]


def _base(tmp_path):
    """A tiny Qwen2 whose weights are large enough (init std 0.4) that turbo and full disagree: at the
    usual 0.02 a random model's next-token distribution is nearly flat in both modes."""
    torch.manual_seed(0)
    rope = {"rope_type": "default", "rope_theta": 1e6}
    model = Qwen2ForCausalLM(Qwen2Config(**COMMON, initializer_range=0.4, rope_parameters=rope))
    base = tmp_path / "base"
    model.save_pretrained(base)
    char_tokenizer().save_pretrained(base)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES))
    return base, data


def _gap(teacher, student, tmp_path) -> float:
    """Mean KL(teacher's full || student's turbo) of the first answer token over the examples, as the
    engine serves them: how far turbo reads from the untouched model reading everything."""
    params = SamplingParams(max_new_tokens=1)
    full_engine = Engine(teacher, KVStore(tmp_path / "teacher", cache_format="float32"))
    turbo_engine = Engine(student, KVStore(tmp_path / "student", cache_format="float32"))
    total = 0.0
    for ex in EXAMPLES:
        full = full_engine.begin(ex["question"], ex["contexts"], "full", params).logits.log_softmax(-1)
        turbo = turbo_engine.begin(ex["question"], ex["contexts"], "turbo", params).logits.log_softmax(-1)
        total += (full.exp() * (full - turbo)).sum().item()
    return total / len(EXAMPLES)


def test_distill_loss_is_zero_on_the_teacher_and_positive_elsewhere():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)  # (A, vocab)
    top = logits.log_softmax(-1).topk(20)
    teacher = Teacher([1, 2, 3], top.indices.tolist(), top.values.tolist())
    assert distill_loss(logits, teacher).item() == pytest.approx(0.0, abs=1e-5)
    assert distill_loss(torch.randn(3, 50), teacher).item() > 0.1


@pytest.mark.parametrize("side", ["query", "both"])
def test_distillation_moves_turbo_toward_full(side, tmp_path):
    """Training turbo against the model's own full prefill lowers the loss and brings turbo's first-token
    distribution closer to full's; full itself stays the base model (query side)."""
    base, data = _base(tmp_path)
    out = tmp_path / "run"
    cfg = TrainConfig(
        data=str(data), out=str(out), model=str(base), objective="distill", side=side, steps=16, batch=2,
        lr=1e-2, rank=8, alpha=16, warmup=1, save_every=8, teacher_tokens=6, teacher_top_k=8,
    )  # fmt: skip
    plain = load_model(str(base), "cpu", "float32")
    before = _gap(plain, plain, tmp_path / "s0")
    dest = finetune(load_model(str(base), "cpu", "float32"), cfg, progress=False)
    losses = [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert sum(losses[-4:]) < 0.7 * sum(losses[:4])
    teachers = (out / "teacher.jsonl").read_text().splitlines()
    assert len(teachers) == len(EXAMPLES)  # each computed once, then read back
    adapted = load_model(str(dest), "cpu", "float32")
    after = _gap(plain, adapted, tmp_path / "s1")
    assert after < 0.7 * before
    if side == "query":
        assert dest.name == "adapter" and query_adapter.attached(adapted.model)
        assert json.loads((dest / "turborag_finetune.json").read_text())["side"] == "query"
        assert adapted.fingerprint == plain.fingerprint
    else:
        assert not query_adapter.attached(adapted.model)  # merged: the caches are its own


def test_resume_reads_teachers_back(tmp_path):
    """A run stopped and resumed computes no teacher twice and ends where one run would."""
    base, data = _base(tmp_path)
    cfg = dict(data=str(data), model=str(base), objective="distill", side="query", batch=1, lr=1e-2,
               rank=4, alpha=8, warmup=1, save_every=2, teacher_tokens=4, teacher_top_k=4)  # fmt: skip
    finetune(
        load_model(str(base), "cpu", "float32"), TrainConfig(out=str(tmp_path / "a"), steps=4, **cfg), False
    )
    b = tmp_path / "b"
    finetune(load_model(str(base), "cpu", "float32"), TrainConfig(out=str(b), steps=2, **cfg), False)
    finetune(load_model(str(base), "cpu", "float32"), TrainConfig(out=str(b), steps=4, **cfg), False)
    assert len((b / "teacher.jsonl").read_text().splitlines()) == len(EXAMPLES)
    la = [json.loads(x)["loss"] for x in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    lb = [json.loads(x)["loss"] for x in (b / "log.jsonl").read_text().splitlines()]
    assert lb == pytest.approx(la, rel=1e-4)


def test_teacher_file_drops_a_line_cut_short(tmp_path):
    path = tmp_path / "teacher.jsonl"
    good = json.dumps({"i": 0, "tokens": [5], "top_ids": [[5]], "top_logprobs": [[0.0]]})
    path.write_text(good + "\n" + '{"i": 1, "tokens": [')
    known = TeacherFile(path)
    assert list(known.known) == [0]
    calls = []
    known.get(1, lambda: calls.append(1) or Teacher([7], [[7]], [[0.0]]))
    assert calls == [1]
    assert sorted(TeacherFile(path).known) == [0, 1]  # the new line was written on a clean line


@pytest.mark.parametrize(
    "changes",
    [
        {"objective": "labels"},
        {"side": "keys"},
        {"side": "query", "causal": True},
        {"objective": "distill", "lora": False},
    ],
)
def test_settings_that_do_not_go_together_are_refused(changes, tmp_path):
    with pytest.raises(ValueError):
        check_config(TrainConfig(data="d", out=str(tmp_path), **changes))


def test_the_command_refuses_a_bad_side_before_loading_a_model(tmp_path):
    from typer.testing import CliRunner

    from turborag.cli import app

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(EXAMPLES[0]) + "\n")
    args = ["finetune", "--data", str(data), "--out", str(tmp_path / "o"), "--model", str(tmp_path / "none")]
    r = CliRunner().invoke(app, [*args, "--side", "keys"])
    assert r.exit_code != 0 and "unknown side 'keys'" in r.output
    r = CliRunner().invoke(app, [*args, "--side", "query", "--causal"])
    assert r.exit_code != 0 and "query-side adapter" in r.output
