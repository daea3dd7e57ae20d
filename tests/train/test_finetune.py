"""Cache-aware fine-tuning on tiny models: same path as serving, loss goes down, resume is exact."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import char_tokenizer, make

from turborag.core import hf_compat, kv
from turborag.core.engine import Engine
from turborag.core.model import LoadedModel, fingerprint
from turborag.store.kv_store import KVStore
from turborag.train.finetune import TrainConfig, answer_ids, example_loss, finetune, serving_logits
from turborag_research.synth import generate, write_jsonl

PASSAGES = [
    "Veltrano was founded by Ismena Throll.",
    "The Sallow runs through Brem.",
    "Cobalt Orchard sings.",
]


def _lm(kind="gemma3") -> LoadedModel:
    model, tok = make(kind), char_tokenizer()
    return LoadedModel(model, tok, "tiny", fingerprint(model, tok), torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("kind", ["gemma3", "qwen2"])
@pytest.mark.parametrize("positions", ["reordered", "composite"])
def test_training_forward_equals_serving_path(kind, positions, tmp_path):
    """The logits training takes its loss from equal the serving engine's (stored caches, assembled)."""
    lm = _lm(kind)
    engine = Engine(lm, KVStore(tmp_path, cache_format="float32"))
    prompt = engine.layout.build("Who founded Veltrano?", PASSAGES)
    tail = prompt.suffix + answer_ids(lm.tokenizer, "Ismena Throll")
    # serving: caches precomputed and stored, read back, assembled, tail prefilled
    engine.precompute(PASSAGES)
    chunks = [engine.store.get(engine.key(c)) for c in prompt.chunks]
    cache, pos = kv.assemble(engine.prefix_kv, chunks, engine.inv_freq, positions)
    with torch.no_grad():
        served = hf_compat.forward(
            lm.model, torch.tensor([tail]), torch.arange(pos, pos + len(tail))[None], cache
        )[0]
    trained = serving_logits(
        lm.model, engine.inv_freq, prompt.prefix, prompt.chunks, tail, positions=positions
    )
    assert trained.requires_grad
    assert (trained.detach() - served).abs().max().item() < 1e-5
    # and the causal variant equals a full prefill
    causal = serving_logits(lm.model, engine.inv_freq, prompt.prefix, prompt.chunks, tail, causal=True)
    with torch.no_grad():
        ids = prompt.ids + tail[len(prompt.suffix) :]
        full = hf_compat.forward(
            lm.model, torch.tensor([ids]), torch.arange(len(ids))[None], hf_compat.new_cache()
        )
    assert (causal.detach() - full[0, -len(tail) :]).abs().max().item() < 1e-5


def _data(tmp_path, n=4):
    path = tmp_path / "train.jsonl"
    write_jsonl(generate(n, 2, seed=5), path)
    return str(path)


def _cfg(tmp_path, **kw) -> TrainConfig:
    base = dict(
        data=_data(tmp_path),
        out=str(tmp_path / "out"),
        steps=12,
        batch=2,
        lr=3e-3,
        warmup=1,
        save_every=3,
        max_passage_tokens=48,
        rank=8,
        alpha=16,
    )
    base.update(kw)
    return TrainConfig(**base)


def _mean_loss(model, lm, cfg, rows):
    from turborag.core.arch import layer_inv_freq
    from turborag.core.prompt import PromptLayout

    inv = torch.stack(layer_inv_freq(lm.model))
    layout = PromptLayout(lm.tokenizer)
    with torch.no_grad():
        return sum(example_loss(model, inv, layout, r, cfg)[0].item() for r in rows) / len(rows)


@pytest.mark.parametrize("lora,causal", [(True, False), (False, False), (True, True)])
def test_few_steps_lower_the_loss(tmp_path, lora, causal):
    lm = _lm()
    cfg = _cfg(tmp_path, lora=lora, causal=causal, lr=1e-2 if lora else 1e-3)
    rows = [r for r in map(__import__("json").loads, open(cfg.data))]
    before = _mean_loss(lm.model, lm, cfg, rows)
    out = finetune(lm, cfg, progress=False)
    from transformers import AutoModelForCausalLM

    tuned = AutoModelForCausalLM.from_pretrained(out).eval()
    after = _mean_loss(tuned, lm, cfg, rows)
    assert after < before * 0.9, (before, after)
    assert (out / "config.json").exists() and (out.parent / "latest").exists()


def test_resume_after_interruption_continues_exactly(tmp_path):
    """Stop after 6 of 12 steps (as a kill between checkpoints would), rerun: same weights as one go."""
    base = _lm()
    whole = finetune(copy.deepcopy(base), _cfg(tmp_path / "a"), progress=False)
    cfg_c = _cfg(tmp_path / "c")
    import json

    partial = cfg_c
    lm_c1 = copy.deepcopy(base)
    _run_until(lm_c1, partial, stop_after=6)
    state = json.loads((tmp_path / "c" / "out" / "ckpt-6" / "state.json").read_text())
    assert state["step"] == 6
    resumed = finetune(copy.deepcopy(base), partial, progress=False)
    from safetensors.torch import load_file

    wa = load_file(whole / "model.safetensors")
    wc = load_file(resumed / "model.safetensors")
    assert wa.keys() == wc.keys()
    assert max((wa[k] - wc[k]).abs().max().item() for k in wa) < 1e-6


def _run_until(lm, cfg, stop_after):
    """Run finetune but raise (like a kill) right after the checkpoint at `stop_after` steps."""
    import turborag.train.finetune as train

    real_save = train.save_checkpoint

    class Killed(Exception):
        pass

    def save_then_die(out, step, *a, **k):
        real_save(out, step, *a, **k)
        if step == stop_after:
            raise Killed

    train.save_checkpoint = save_then_die
    try:
        with pytest.raises(Killed):
            finetune(lm, cfg, progress=False)
    finally:
        train.save_checkpoint = real_save


def test_adapter_folder_loads_as_a_model(tmp_path, tiny_model_dir, monkeypatch):
    """`--model OUT/adapter` (base + LoRA merged at load) serves the same model as `--model OUT/model`;
    the merge is kept on disk, and a load from it is the same model (same fingerprint, same logits)."""
    from turborag.core.model import load_model

    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))

    cfg = _cfg(tmp_path, model=tiny_model_dir, steps=3)
    merged_dir = finetune(load_model(tiny_model_dir, dtype="float32"), cfg, progress=False)
    a = load_model(str(merged_dir), dtype="float32")
    b = load_model(str(merged_dir.parent / "adapter"), dtype="float32")
    base = load_model(tiny_model_dir, dtype="float32")
    assert a.fingerprint != base.fingerprint  # a fine-tune never shares caches with its base
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        la, lb = a.model(input_ids=x).logits, b.model(input_ids=x).logits
    assert (la - lb).abs().max().item() < 1e-4
    merged = list((tmp_path / "home" / "models").glob("merged-adapter-*"))
    assert len(merged) == 1 and (merged[0] / "config.json").exists()
    again = load_model(str(merged_dir.parent / "adapter"), dtype="float32")  # from the kept merge
    assert again.fingerprint == b.fingerprint
    with torch.no_grad():
        assert torch.equal(again.model(input_ids=x).logits, lb)


def test_bf16_training_keeps_lora_in_fp32_logs_steps_and_merges_into_fp32(
    tmp_path, tiny_model_dir, monkeypatch
):
    """bf16 base weights, fp32 adapter + optimizer; log.jsonl has a line per step; snapshots every N steps;
    the exported model is the adapter merged into the fp32 base (as serving merges it)."""
    import json

    from safetensors.torch import load_file

    from turborag.core.model import load_model
    from turborag.train.finetune import _trainable, prepare_model

    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    cfg = _cfg(tmp_path, model=tiny_model_dir, steps=4, keep_every=2, dtype="bfloat16")
    lm = load_model(tiny_model_dir, dtype="bfloat16")
    peft_model = prepare_model(copy.deepcopy(lm), cfg)
    trainable = _trainable(peft_model)
    assert trainable and all(p.dtype == torch.float32 for p in trainable.values())
    frozen = [p for p in peft_model.parameters() if not p.requires_grad]
    assert all(p.dtype == torch.bfloat16 for p in frozen)

    out = finetune(lm, cfg, progress=False)
    log = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and all(r["s"] > 0 for r in log)
    if Path("/proc/self/statm").exists():  # the resident memory after each step, to catch growth
        assert all(0 < r["rss_gb"] < 100 for r in log)
    snaps = sorted(p.name for p in (tmp_path / "out" / "snapshots").iterdir())
    assert snaps == ["step-2", "step-4"]
    meta = json.loads((tmp_path / "out" / "snapshots" / "step-2" / "turborag_finetune.json").read_text())
    assert meta["steps_trained"] == 2 and meta["cache_aware"] is True
    weights = load_file(out / "model.safetensors")
    assert all(w.dtype == torch.float32 for w in weights.values())
    from_adapter = load_model(str(tmp_path / "out" / "adapter"), dtype="float32")
    merged = load_model(str(out), dtype="float32")
    assert from_adapter.fingerprint == merged.fingerprint


def test_full_fine_tuning_refuses_bf16_weights(tmp_path, tiny_model_dir):
    from turborag.core.model import load_model

    cfg = _cfg(tmp_path, model=tiny_model_dir, lora=False, steps=1)
    with pytest.raises(ValueError, match="fp32"):
        finetune(load_model(tiny_model_dir, dtype="bfloat16"), cfg, progress=False)


def test_init_adapter_starts_a_second_stage_from_the_first(tmp_path, tiny_model_dir):
    """--init-adapter: the wrapped model starts with the saved adapter's weights (not zero-initialised B),
    and an adapter of another rank or a folder that is not one is refused with a clear error."""
    from safetensors.torch import load_file

    from turborag.core.model import load_model
    from turborag.train.finetune import _trainable, prepare_model

    first = _cfg(tmp_path, model=tiny_model_dir, steps=3)
    finetune(load_model(tiny_model_dir, dtype="float32"), first, progress=False)
    saved = load_file(tmp_path / "out" / "adapter" / "adapter_model.safetensors")
    assert any(w.abs().sum() > 0 for k, w in saved.items() if "lora_B" in k)  # stage one really trained

    second = _cfg(
        tmp_path,
        model=tiny_model_dir,
        out=str(tmp_path / "out2"),
        init_adapter=str(tmp_path / "out" / "adapter"),
    )
    model = prepare_model(load_model(tiny_model_dir, dtype="float32"), second)
    trainable = {k.replace(".default", ""): p for k, p in _trainable(model).items()}
    assert set(trainable) == set(saved)
    assert all(torch.equal(trainable[k].detach(), w) for k, w in saved.items())

    with pytest.raises(ValueError, match="rank 8, not 4"):
        prepare_model(
            load_model(tiny_model_dir, dtype="float32"),
            _cfg(tmp_path, rank=4, init_adapter=second.init_adapter),
        )
    with pytest.raises(ValueError, match="not a LoRA adapter"):
        prepare_model(load_model(tiny_model_dir, dtype="float32"), _cfg(tmp_path, init_adapter=str(tmp_path)))


def test_resident_memory_is_read_and_freed_memory_released():
    """The loop's memory helpers: a plausible resident size on Linux, and a trim that never raises and runs
    only past its share of RAM."""
    from turborag.train.finetune import _malloc_trim, release_freed_memory, resident_gb

    rss = resident_gb()
    if Path("/proc/self/statm").exists():
        assert rss is not None and 0.01 < rss < 100
    else:
        assert rss is None
    assert release_freed_memory(above=0) is (_malloc_trim() is not None)  # glibc: trims; elsewhere: nothing
    assert release_freed_memory(above=2.0) is False  # never holds twice the machine's RAM
    assert release_freed_memory() is False  # a test process is far below 80% of RAM
