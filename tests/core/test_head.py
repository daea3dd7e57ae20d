"""core/head.py: the output layer's few-rows product is nn.Linear's, to float rounding, with the same weights,
state dict and gradients; load_model gives it to the models it loads."""

from __future__ import annotations

import torch
from conftest import char_tokenizer, make
from torch import nn

from turborag.core.head import FEW_ROWS, FewRowsLinear, use_few_rows_head
from turborag.core.model import load_model


def test_same_products_as_linear_for_few_and_many_rows():
    torch.manual_seed(0)
    plain = nn.Linear(48, 1000, bias=False)
    fast = nn.Linear(48, 1000, bias=False)
    fast.load_state_dict(plain.state_dict())
    fast.__class__ = FewRowsLinear
    for shape in ((1, 48), (6, 48), (2, 4, 48), (1, FEW_ROWS, 48), (3, FEW_ROWS, 48)):
        x = torch.randn(shape)
        got = fast(x)
        assert got.shape == shape[:-1] + (1000,) and got.is_contiguous()
        torch.testing.assert_close(got, plain(x), atol=1e-5, rtol=1e-5)


def test_vocabulary_blocks_per_thread_and_the_fallback(monkeypatch):
    """Split into one vocabulary block per thread when the threads divide it, else one product: the same
    numbers either way."""
    torch.manual_seed(0)
    for vocab, threads in ((1000, 4), (1001, 2), (1000, 1)):
        monkeypatch.setattr(torch, "get_num_threads", lambda t=threads: t)
        head = nn.Linear(32, vocab, bias=False)
        x = torch.randn(3, 32)
        want = head(x)
        head.__class__ = FewRowsLinear
        torch.testing.assert_close(head(x), want, atol=1e-5, rtol=1e-5)


def test_gradients_and_state_dict_unchanged():
    torch.manual_seed(0)
    head = nn.Linear(16, 50, bias=False)
    ref = nn.Linear(16, 50, bias=False)
    ref.load_state_dict(head.state_dict())
    model = nn.Module()
    model.get_output_embeddings = lambda: head
    assert use_few_rows_head(model) and type(head) is FewRowsLinear
    assert list(head.state_dict()) == ["weight"]
    x = torch.randn(5, 16)
    head(x).square().sum().backward()
    ref(x).square().sum().backward()
    torch.testing.assert_close(head.weight.grad, ref.weight.grad)
    biased = nn.Module()
    biased.get_output_embeddings = lambda: nn.Embedding(3, 3)  # not a plain Linear: left alone
    assert not use_few_rows_head(biased)


def test_load_model_gives_the_head_and_keeps_logits(tmp_path):
    """A tiny Gemma 3 saved and loaded: its output layer (tied to the embeddings) has the few-rows forward,
    and the logits of a forward equal those of the model as saved."""
    model = make("gemma3")
    model.save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), "cpu", "float32")
    head = lm.model.get_output_embeddings()
    assert type(head) is FewRowsLinear
    assert head.weight.data_ptr() == lm.model.get_input_embeddings().weight.data_ptr()  # still tied
    ids = torch.tensor([[5, 9, 14, 3, 7]])
    with torch.no_grad():
        torch.testing.assert_close(lm.model(ids).logits, model.eval()(ids).logits, atol=1e-5, rtol=1e-5)
