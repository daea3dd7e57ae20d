"""Int8 weights for decode steps (core/decode_weights.py): prefills and everything stored stay the float
model's, decode steps multiply the int8 copies, batched or alone, and the engine refuses what it cannot
honour."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, char_tokenizer, make
from torch import nn

from turborag.core import decode_weights as dw
from turborag.core.batch import DecodeBatch
from turborag.core.engine import Engine
from turborag.core.errors import ModelError
from turborag.core.generate import SamplingParams
from turborag.core.head import use_few_rows_head
from turborag.core.model import LoadedModel, fingerprint
from turborag.core.options import EngineOptions
from turborag.store.kv_store import KVStore

CPU = torch.device("cpu")
Q = "Who wrote the note?"
PASSAGES = ["The note was written by Ada in the spring.", "Bob read it twice and kept it."]


def _lm(kind: str = "gemma3") -> LoadedModel:
    model, tok = make(kind), char_tokenizer()
    use_few_rows_head(model)  # as load_model does
    return LoadedModel(model, tok, f"tiny-{kind}", fingerprint(model, tok), CPU, torch.float32)


def _linears(model: nn.Module) -> int:
    return sum(1 for m in model.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize("kind", list(TINY))
def test_copies_leave_weights_state_dict_and_fingerprint_alone(kind):
    lm = _lm(kind)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    assert dw.use_int8_decode(lm.model) == _linears(lm.model) and dw.has_int8(lm.model)
    after = lm.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert fingerprint(lm.model, lm.tokenizer) == lm.fingerprint
    assert dw.use_int8_decode(lm.model) == 0  # once per model


def test_forwards_outside_decoding_are_the_float_models():
    plain, quant = make("qwen2"), make("qwen2")
    use_few_rows_head(plain)  # as load_model does, for both
    use_few_rows_head(quant)
    dw.use_int8_decode(quant)
    ids = torch.tensor([[5, 17, 33, 8, 60]])  # a prefill of a few rows: below FEW_ROWS, still float
    assert torch.equal(plain(ids).logits, quant(ids).logits)


def test_decoding_multiplies_the_int8_copy():
    torch.manual_seed(0)
    layer = nn.Linear(64, 96, bias=False)
    dw.use_int8_decode(nn.Sequential(layer))
    x = torch.randn(3, 64)
    with dw.decoding():
        y = layer(x)
    expected = x.bfloat16().float() @ dw.dequantized(layer).T
    assert torch.allclose(y, expected, atol=2e-2, rtol=1e-2)
    assert not torch.equal(y, x @ layer.weight.T)
    rel = (y - x @ layer.weight.T).norm() / (x @ layer.weight.T).norm()
    assert rel < 0.02  # int8 per row and bf16 activations: about 1% of the product
    many = torch.randn(dw.FEW_ROWS + 1, 64)
    with dw.decoding():
        assert torch.equal(layer(many), many @ layer.weight.T)  # a large batch reads the float weights


def test_bf16_weights_use_the_int8_copy_for_fewer_rows():
    fp32, bf16 = nn.Linear(64, 32, bias=False), nn.Linear(64, 32, bias=False).bfloat16()
    dw.use_int8_decode(nn.Sequential(fp32, bf16))
    assert (fp32.few_rows, bf16.few_rows) == (dw.FEW_ROWS, dw.FEW_ROWS_BF16)
    x = torch.randn(dw.FEW_ROWS_BF16 + 1, 64, dtype=torch.bfloat16)
    with dw.decoding():
        assert torch.equal(bf16(x), x @ bf16.weight.T)  # past its few rows: the bf16 weights


def test_a_bias_is_added_to_the_int8_product():
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)  # as Qwen's q, k and v projections
    dw.use_int8_decode(nn.Sequential(layer))
    x = torch.randn(2, 64)
    with dw.decoding():
        y = layer(x)
    expected = x.bfloat16().float() @ dw.dequantized(layer).T + layer.bias
    assert torch.allclose(y, expected, atol=2e-2, rtol=1e-2)
    assert (y - layer.bias).abs().max() > 0.1  # not the bias alone


def test_adapter_layers_stay_float():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(make("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    dw.use_int8_decode(model)
    for name, m in model.named_modules():
        if "lora_" in name and isinstance(m, nn.Linear):
            assert type(m) is nn.Linear
    assert any(isinstance(m, dw.Int8DecodeLinear) for m in model.modules())


def test_stored_caches_and_the_first_token_are_the_float_models(tmp_path):
    floats = Engine(_lm(), KVStore(tmp_path / "a", cache_format="float32"))
    int8 = Engine(
        _lm(), KVStore(tmp_path / "b", cache_format="float32"), EngineOptions(decode_weights="int8")
    )
    floats.precompute(PASSAGES)
    int8.precompute(PASSAGES)
    for p in PASSAGES:
        key = floats.key(floats.layout.chunk_ids(p))
        assert key == int8.key(int8.layout.chunk_ids(p))
        a, b = floats.store.get(key), int8.store.get(key)
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    params = SamplingParams(max_new_tokens=8, min_tokens=8)
    for mode in ("full", "turbo"):
        fa, ia = floats.answer(Q, PASSAGES, mode, params), int8.answer(Q, PASSAGES, mode, params)
        assert fa.token_ids[0] == ia.token_ids[0] and len(ia.token_ids) == 8


def test_batched_decode_gives_each_row_its_own_logits(tmp_path):
    engine = Engine(_lm(), KVStore(tmp_path, cache_format="float32"), EngineOptions(decode_weights="int8"))
    params = SamplingParams(max_new_tokens=6, min_tokens=6)
    alone, together = [], []
    for q in (Q, "What did Bob do?"):
        seq = engine.begin(q, PASSAGES, "turbo", params)
        seq.advance()
        engine.step(seq)
        alone.append(seq.logits)
        seq2 = engine.begin(q, PASSAGES, "turbo", params)
        seq2.advance()
        together.append(seq2)
    DecodeBatch(engine.lm.model, engine.windows).step(together)
    for a, s in zip(alone, together, strict=True):
        assert torch.allclose(a, s.logits, atol=1e-4)


def test_refusals(tmp_path):
    lm = _lm()
    Engine(lm, KVStore(tmp_path / "a"), EngineOptions(decode_weights="int8"))
    with pytest.raises(ValueError, match="int8"):
        Engine(lm, KVStore(tmp_path / "b"))  # the shared model decodes with int8 now
    with pytest.raises(ValueError, match="decode_weights"):
        Engine(_lm(), KVStore(tmp_path / "c")).with_options(decode_weights="int8")
    with pytest.raises(ValueError, match="use float or int8"):
        EngineOptions(decode_weights="int4")
    with pytest.raises(ModelError, match="CPU only"):
        dw.use_int8_decode(make("llama").to("meta"))
