"""The family table (core/arch.py): every family has its tiny model, and what the engine reads per family
(RoPE tables, end-of-turn markers, LoRA targets) is found in it."""

from __future__ import annotations

import pytest
import torch
from conftest import COMMON, TINY, char_tokenizer, make
from transformers import PhiConfig, PhiForCausalLM

from turborag.core import arch
from turborag.core.errors import ModelError


def test_every_family_has_a_tiny_model_of_its_type():
    assert [f.name for f in arch.FAMILIES] == list(TINY)
    for fam in arch.FAMILIES:
        model = make(fam.name)
        assert model.config.model_type in fam.model_types
        assert arch.family(model) is fam


@pytest.mark.parametrize("name", list(TINY))
def test_lora_targets_name_linear_layers_of_the_family(name):
    model = make(name)
    found = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(arch.family(model).lora_targets) <= found


@pytest.mark.parametrize("name", list(TINY))
def test_each_layer_gets_its_rope_table(name):
    model = make(name)
    inv = arch.layer_inv_freq(model)
    assert len(inv) == model.config.num_hidden_layers
    rot = arch.rotary_module(model)
    for lt, table in zip(arch.layer_types(model), inv, strict=True):
        own = getattr(rot, f"{lt}_inv_freq") if arch.family(model).rope_per_layer_type else rot.inv_freq
        assert torch.equal(table, own.to(torch.float64))


def test_gemma3_layer_types_keep_their_own_bases():
    inv = arch.layer_inv_freq(make("gemma3"))  # sliding, sliding, sliding, full
    assert torch.equal(inv[0], inv[1])
    assert not torch.equal(inv[0], inv[3])


def test_a_missing_rope_table_names_the_family_table(monkeypatch):
    model = make("qwen2")
    monkeypatch.delattr(arch.rotary_module(model), "inv_freq")
    with pytest.raises(ModelError, match="turborag/core/arch.py"):
        arch.layer_inv_freq(model)


def _with_markers(markers: list[str]):
    tok = char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": markers})
    return tok


def test_end_of_turn_ids_are_the_familys_markers_and_eos():
    markers = ["<end_of_turn>", "<|im_end|>", "<|eot_id|>"]
    tok = _with_markers(markers)
    ids = {m: tok.convert_tokens_to_ids(m) for m in markers}
    gemma = arch.end_of_turn_ids(tok, make("gemma3"))
    qwen = arch.end_of_turn_ids(tok, make("qwen2"))
    assert gemma == {tok.eos_token_id, ids["<end_of_turn>"]}
    assert qwen == {tok.eos_token_id, ids["<|im_end|>"]}


def test_markers_unknown_to_the_tokenizer_are_skipped():
    tok = char_tokenizer()
    assert arch.end_of_turn_ids(tok, make("llama")) == {tok.eos_token_id}


def test_a_type_outside_the_table_runs_as_generic():
    torch.manual_seed(0)
    model = PhiForCausalLM(PhiConfig(**COMMON)).eval()
    assert arch.family(model) is arch.GENERIC
    arch.check_supported(model)
    assert len(arch.layer_inv_freq(model)) == model.config.num_hidden_layers
    tok = _with_markers(["<|im_end|>", "<end_of_turn>"])
    assert arch.end_of_turn_ids(tok, model) == {
        tok.eos_token_id,
        tok.convert_tokens_to_ids("<|im_end|>"),
        tok.convert_tokens_to_ids("<end_of_turn>"),
    }
