"""Quantized weights for decode steps (core/decode_weights.py): prefills and everything stored stay the float
model's, decode steps multiply the int8 or 4-bit copies, batched or alone, and the engine refuses what it
cannot honour."""

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
    assert dw.use_decode_weights(lm.model, "int8") == _linears(lm.model) and dw.kind_of(lm.model) == "int8"
    after = lm.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert fingerprint(lm.model, lm.tokenizer) == lm.fingerprint
    assert dw.use_decode_weights(lm.model, "int8") == 0  # once per model


def test_forwards_outside_decoding_are_the_float_models():
    plain, quant = make("qwen2"), make("qwen2")
    use_few_rows_head(plain)  # as load_model does, for both
    use_few_rows_head(quant)
    dw.use_decode_weights(quant, "int8")
    ids = torch.tensor([[5, 17, 33, 8, 60]])  # a prefill of a few rows: below FEW_ROWS, still float
    assert torch.equal(plain(ids).logits, quant(ids).logits)


def test_decoding_multiplies_the_int8_copy():
    torch.manual_seed(0)
    layer = nn.Linear(64, 96, bias=False)
    dw.use_decode_weights(nn.Sequential(layer), "int8")
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
    dw.use_decode_weights(nn.Sequential(fp32, bf16), "int8")
    assert (fp32.few_rows, bf16.few_rows) == (dw.FEW_ROWS, dw.FEW_ROWS_BF16)
    x = torch.randn(dw.FEW_ROWS_BF16 + 1, 64, dtype=torch.bfloat16)
    with dw.decoding():
        assert torch.equal(bf16(x), x @ bf16.weight.T)  # past its few rows: the bf16 weights


def test_a_bias_is_added_to_the_int8_product():
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)  # as Qwen's q, k and v projections
    dw.use_decode_weights(nn.Sequential(layer), "int8")
    x = torch.randn(2, 64)
    with dw.decoding():
        y = layer(x)
    expected = x.bfloat16().float() @ dw.dequantized(layer).T + layer.bias
    assert torch.allclose(y, expected, atol=2e-2, rtol=1e-2)
    assert (y - layer.bias).abs().max() > 0.1  # not the bias alone


def test_adapter_layers_stay_float():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(make("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    dw.use_decode_weights(model, "int8")
    for name, m in model.named_modules():
        if "lora_" in name and isinstance(m, nn.Linear):
            assert type(m) is nn.Linear
    assert any(isinstance(m, dw.DecodeLinear) for m in model.modules())


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


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_batched_decode_gives_each_row_its_own_logits(tmp_path, kind):
    lm = _lm()
    _snap4(lm.model)  # the 4-bit copies are made (layers on a grid), not int8 ones
    engine = Engine(lm, KVStore(tmp_path, cache_format="float32"), EngineOptions(decode_weights=kind))
    assert any(
        m.bits == (4 if kind == "int4" else 8) for m in lm.model.modules() if isinstance(m, dw.DecodeLinear)
    )
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
    with pytest.raises(ValueError, match="use float, int8 or int4"):
        EngineOptions(decode_weights="int3")
    with pytest.raises(ModelError, match="CPU only"):
        dw.use_decode_weights(make("llama").to("meta"))


def _on_grid4(weight: torch.Tensor, group: int = dw.GROUP) -> torch.Tensor:
    """The weight snapped onto a 4-bit grid per group of inputs (as a Q4 GGUF's layers are): a step and an
    offset per group, levels 0..15."""
    out, width = weight.shape
    wg = weight.detach().float().view(out, width // group, group)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    step = (hi - lo) / 15
    return (lo + step * torch.round((wg - lo) / step)).view(out, width)


def _snap4(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if type(m) in (nn.Linear,) and m.in_features % dw.GROUP == 0:
            with torch.no_grad():
                m.weight.copy_(_on_grid4(m.weight))
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_copies_a_weight_on_a_4bit_grid_exactly(dtype):
    torch.manual_seed(0)
    layer = nn.Linear(128, 48, bias=False)
    with torch.no_grad():
        layer.weight.copy_(_on_grid4(layer.weight))
    layer = layer.to(dtype)  # bf16 weights: the grid's values rounded
    dw.use_decode_weights(nn.Sequential(layer), "int4")
    assert layer.bits == 4 and layer.few_rows == dw.FEW_ROWS_INT4
    w = layer.weight.float()
    # only the scale and offset are rounded to bf16: about the bf16 weights' own error, far under int8's
    assert (dw.dequantized(layer) - w).abs().max() <= 2.0**-6 * w.abs().max()
    x = torch.randn(3, 128, dtype=dtype)
    with dw.decoding():
        y = layer(x).float()
    ref = x.float() @ w.T
    assert (y - ref).norm() / ref.norm() < 0.01
    many = torch.randn(dw.FEW_ROWS_INT4 + 1, 128, dtype=dtype)
    with dw.decoding():
        assert torch.equal(layer(many), many @ layer.weight.T)  # past its few rows: the float weights


def test_int4_gives_a_layer_off_the_grid_the_int8_copy():
    torch.manual_seed(0)
    off, on, odd = nn.Linear(64, 32, bias=False), nn.Linear(64, 32), nn.Linear(40, 32, bias=False)
    with torch.no_grad():
        on.weight.copy_(_on_grid4(on.weight))
        odd.weight.copy_(_on_grid4(nn.Linear(64, 32).weight)[:, :40])  # 40 inputs: no whole groups
    assert dw.use_decode_weights(nn.Sequential(off, on, odd), "int4") == 3
    assert (off.bits, on.bits, odd.bits) == (8, 4, 8)
    assert all(m.kind == "int4" for m in (off, on, odd))
    x = torch.randn(2, 64)
    with dw.decoding():
        y = on(x)
    ref = x @ on.weight.T + on.bias
    assert (y - ref).norm() / ref.norm() < 0.01  # the bias is added to the 4-bit product


def test_grid4_rejects_more_than_16_levels():
    levels = torch.arange(17, dtype=torch.float32) * 0.01  # 17 levels in one group
    weight = torch.cat([levels, torch.zeros(dw.GROUP - 17)]).repeat(16, 1)  # (16, 32)
    assert dw.grid4(weight) is None
    assert dw.grid4(_on_grid4(torch.randn(16, 32))) is not None
    assert dw.grid4(torch.zeros(16, 32)) is not None  # a constant group: its offset alone


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_int4_engine_stores_the_float_caches_and_decodes_with_the_copies(tmp_path, kind):
    def lm() -> LoadedModel:
        model, tok = _snap4(make("qwen2")), char_tokenizer()
        use_few_rows_head(model)
        return LoadedModel(model, tok, "tiny-qwen2", fingerprint(model, tok), CPU, torch.float32)

    floats = Engine(lm(), KVStore(tmp_path / "a", cache_format="float32"))
    quant = Engine(lm(), KVStore(tmp_path / "b", cache_format="float32"), EngineOptions(decode_weights=kind))
    layers = [m for m in quant.lm.model.modules() if isinstance(m, dw.DecodeLinear)]
    whole = {m.bits for m in layers if m.out_features % 16 == 0}  # the 4-bit kernel packs 16 rows a tile
    assert whole == ({4} if kind == "int4" else {8})  # every tiny layer is on the grid
    assert {m.bits for m in layers} - whole <= {8}  # the output layer of 104 rows: int8
    floats.precompute(PASSAGES)
    quant.precompute(PASSAGES)
    key = floats.key(floats.layout.chunk_ids(PASSAGES[0]))
    a, b = floats.store.get(key), quant.store.get(key)
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    params = SamplingParams(max_new_tokens=6, min_tokens=6)
    seq_f, seq_q = floats.begin(Q, PASSAGES, "turbo", params), quant.begin(Q, PASSAGES, "turbo", params)
    assert torch.equal(seq_f.logits, seq_q.logits)  # the prefill's: float weights in both
    seq_f.advance()  # greedy: the same first token
    seq_q.advance()
    floats.step(seq_f)
    quant.step(seq_q)
    assert not torch.equal(seq_f.logits, seq_q.logits)  # the decode step read the copies
    assert torch.allclose(seq_f.logits, seq_q.logits, atol=0.05 * seq_f.logits.abs().max().item())


def test_a_model_with_copies_of_one_kind_refuses_the_other():
    model = make("llama")
    dw.use_decode_weights(model, "int8")
    with pytest.raises(ModelError, match="int8 weights already"):
        dw.use_decode_weights(model, "int4")
    assert dw.drop_decode_weights(model) == _linears(model) and dw.kind_of(model) == "float"
    assert dw.use_decode_weights(model, "int4") == _linears(model) and dw.kind_of(model) == "int4"
    with pytest.raises(ValueError, match="unknown decode weights"):
        dw.use_decode_weights(model, "float")


def test_copies_kept_on_disk_are_read_back_not_made_again(tmp_path, monkeypatch):
    monkeypatch.setattr(dw, "KEEP_WEIGHTS", 0)  # a tiny model keeps its copies as a real one does
    keep = tmp_path / "fp-int4.safetensors"
    first = _snap4(make("qwen2"))
    dw.use_decode_weights(first, "int4", keep)
    assert keep.is_file()

    def made_again(*args, **kwargs):
        raise AssertionError("the copies were made again")

    monkeypatch.setattr(dw, "grid4", made_again)
    monkeypatch.setattr(dw, "_quantize_int8", made_again)
    second = _snap4(make("qwen2"))
    assert dw.use_decode_weights(second, "int4", keep) == _linears(second)
    for (name, a), b in zip(first.named_modules(), second.modules(), strict=True):
        if isinstance(a, dw.DecodeLinear):
            assert (a.bits, a.few_rows) == (b.bits, b.few_rows), name
            assert torch.equal(a.qweight, b.qweight) and torch.equal(a.qscale, b.qscale), name


def test_a_damaged_kept_file_is_made_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(dw, "KEEP_WEIGHTS", 0)
    keep = tmp_path / "fp-int8.safetensors"
    keep.write_bytes(b"not a safetensors file")
    model = make("llama")
    assert dw.use_decode_weights(model, "int8", keep) == _linears(model)
    assert "unreadable" in caplog.text
    assert dw.kind_of(model) == "int8" and len(dw._read_copies(keep)) == 2 * _linears(model)


def test_a_torch_without_the_kernel_is_refused_clearly(monkeypatch):
    monkeypatch.setitem(dw.KERNELS, "int4", ("_weight_int8pack_mm", "_no_such_int4_kernel"))
    with pytest.raises(ModelError, match="_no_such_int4_kernel.*--decode-weights float"):
        dw.use_decode_weights(make("llama"), "int4")
