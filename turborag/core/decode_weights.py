"""Int8 weights for decode steps: inside `decoding()`, the model's linear layers read 8-bit copies of their
weights (on a CPU, for up to `FEW_ROWS` sequences); everywhere else, their own weights.

A decode step runs one token per sequence through every weight: on a CPU it is bound by memory bandwidth,
and an int8 copy is a quarter of the bytes of fp32 (half of bf16). A prefill runs hundreds of rows, is
bound by arithmetic, and keeps the model's own weights: so the chunk caches, the prefix cache and every
prefill are exactly the unquantized model's, the store and the model's fingerprint are shared with it, and
only the tokens a decode step produces (and the K/V it writes for them) come from the int8 weights.

The product is PyTorch's CPU weight-only kernel (`aten._weight_int8pack_mm`: int8 weights with one scale
per output row, symmetric). It is fast with bf16 activations and slow with fp32 ones, so the few rows are
cast to bf16 for it and the result back to the compute dtype (a layer's bias, such as Qwen's q/k/v, is
added after). A decode step of more than `FEW_ROWS` sequences, or one not on the CPU, runs the float
weights. Only the engine's decode steps
(Engine.step, DecodeBatch.step) enter `decoding()`: a prefill of a few tokens (a short chunk, a short
question) still reads the float weights, so what is stored never depends on this.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
from torch import nn

from turborag.core.errors import ModelError
from turborag.core.head import FewRowsLinear

# Rows up to which the int8 product beats the float one: against fp32 weights up to a decode batch of 16;
# against bf16 weights (which bf16 hardware multiplies fast) only up to 4, the int8 kernel being bound by
# its dequantizing arithmetic on a CPU of few cores, not by the bytes it reads.
FEW_ROWS = 16
FEW_ROWS_BF16 = 4
WEIGHTS = ("float", "int8")  # what `decode_weights` takes
_DECODING = contextvars.ContextVar("turborag_decoding", default=False)


@contextlib.contextmanager
def decoding():
    """Forwards inside this block are decode steps: layers with an int8 copy use it."""
    token = _DECODING.set(True)
    try:
        yield
    finally:
        _DECODING.reset(token)


def has_int8(model: nn.Module) -> bool:
    """Whether the model's layers carry int8 copies (use_int8_decode ran on it)."""
    return any(isinstance(m, Int8DecodeLinear) for m in model.modules())


def _quantize(weight: torch.Tensor, block: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float -> int8 (out, in) and one bf16 scale per output row, w ~ q * scale with |q| <= 127,
    `block` rows at a time (the output layer of a 150k vocabulary would otherwise need GBs of temporaries)."""
    q = torch.empty(weight.shape, dtype=torch.int8)
    scale = torch.empty(weight.shape[0], dtype=torch.bfloat16)
    for lo in range(0, weight.shape[0], block):
        w = weight[lo : lo + block].detach().float()  # (b, in)
        s = (w.abs().amax(dim=1).clamp(min=1e-12) / 127.0).to(torch.bfloat16)  # (b,) as the kernel reads it
        q[lo : lo + block] = torch.round(w / s.float()[:, None]).clamp(-127, 127).to(torch.int8)
        scale[lo : lo + block] = s
    return q, scale


class Int8DecodeLinear(nn.Linear):
    """`nn.Linear` whose few-row CPU forwards multiply the int8 copy (`qweight`, `qscale`)."""

    qweight: torch.Tensor  # (out, in) int8, a non-persistent buffer: the state dict is the float layer's
    qscale: torch.Tensor  # (out,) bf16
    few_rows: int = FEW_ROWS  # rows up to which the int8 copy is used

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not _DECODING.get() or rows > self.few_rows or x.device.type != "cpu":
            return super().forward(x)
        flat = x.reshape(rows, x.shape[-1]).to(torch.bfloat16)  # (R, in)
        out = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.qscale)  # (R, out)
        out = out.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


class Int8DecodeHead(Int8DecodeLinear):
    """The output layer: int8 on few rows, else the few-rows float product (head.py) or the plain one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not _DECODING.get() or rows > self.few_rows or x.device.type != "cpu":
            return FewRowsLinear.forward(self, x)
        return super().forward(x)


def use_int8_decode(model: nn.Module) -> int:
    """Give every linear layer of the model an int8 copy for decode steps; returns how many (0 when the
    model has them already).

    The model's weights, state dict and fingerprint are unchanged (the copies are non-persistent buffers).
    Refused off the CPU: the kernel is a CPU one."""
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ModelError(f"int8 decode weights run on the CPU only (the model is on {device})")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    count = 0
    for name, module in model.named_modules():
        if type(module) not in (nn.Linear, FewRowsLinear):
            continue
        if "lora_" in name:  # an adapter's own low-rank layers stay float: they are small and delicate
            continue
        q, scale = _quantize(module.weight)
        module.register_buffer("qweight", q, persistent=False)
        module.register_buffer("qscale", scale, persistent=False)
        module.__class__ = Int8DecodeHead if module is head else Int8DecodeLinear
        module.few_rows = FEW_ROWS_BF16 if module.weight.dtype == torch.bfloat16 else FEW_ROWS
        count += 1
    return count


def dequantized(module: Int8DecodeLinear) -> torch.Tensor:
    """The weight the int8 product computes with, (out, in) fp32: for tests and error reports."""
    return module.qweight.float() * module.qscale.float()[:, None]
