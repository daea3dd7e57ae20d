"""Quantized weights for decode steps: inside `decoding()`, the model's linear layers read 8- or 4-bit copies
of their weights (on a CPU, for a few sequences); everywhere else, their own weights.

A decode step runs one token per sequence through every weight: on a CPU it is bound by memory bandwidth,
and an int8 copy is half the bytes of bf16, a 4-bit one with its scales under a third. A prefill runs
hundreds of rows, is bound by arithmetic, and keeps the model's own weights: so the chunk caches, the
prefix cache and every prefill are exactly the unquantized model's, the store and the model's fingerprint
are shared with it, and only the tokens a decode step produces (and the K/V it writes for them) come from
the copies.

The products are PyTorch's CPU weight-only kernels, fast with bf16 activations (the few rows are cast to
bf16 for them and the result back to the compute dtype; a layer's bias, such as Qwen's q/k/v, is added
after):

- "int8": `aten._weight_int8pack_mm`, int8 weights with one scale per output row, symmetric; for every layer.
- "int4": `aten._weight_int4pack_mm_for_cpu`, 4 bits in groups of 32 inputs with a scale and an offset each,
  for the layers whose weights already lie on such a grid: a model dequantized from a Q4 GGUF (Q4_K's
  sub-blocks are 32 wide), where the 4-bit copy is the file's own values. Only the scale and offset are
  rounded to bf16, about the error of the bf16 weights themselves. Every other layer (a GGUF's Q6_K ones, a
  model trained in float) gets the int8 copy: "int4" adds no 4-bit rounding the model does not have
  already.

A decode step of more sequences than a layer's `few_rows`, or one not on the CPU, runs the float weights.
Only the engine's decode steps (Engine.step, DecodeBatch.step) enter `decoding()`: a prefill of a few
tokens (a short chunk, a short question) still reads the float weights, so what is stored never depends on
this.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from turborag.core.defaults import DECODE_WEIGHTS
from turborag.core.errors import ModelError
from turborag.core.head import FewRowsLinear

# Rows up to which a quantized product beats the float one, measured on 2 cores: int8 against fp32 weights
# up to a decode batch of 16, against bf16 weights (which bf16 hardware multiplies fast) only up to 4, the
# int8 kernel being bound by its dequantizing arithmetic; the 4-bit kernel reads half as much and beat bf16
# weights at 8 rows.
FEW_ROWS = 16
FEW_ROWS_BF16 = 4
FEW_ROWS_INT4 = 8
GROUP = 32  # inputs per 4-bit scale and offset: one Q4_K sub-block
KEEP_WEIGHTS = 100_000_000  # a model with more linear weights keeps its copies on disk (use_decode_weights)
WEIGHTS = DECODE_WEIGHTS  # what `decode_weights` takes
# PyTorch's CPU kernel each kind multiplies with (int4 also needs int8's, for the layers off the grid)
KERNELS = {"int8": ("_weight_int8pack_mm",), "int4": ("_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu")}
_DECODING = contextvars.ContextVar("turborag_decoding", default=False)
log = logging.getLogger(__name__)


@contextlib.contextmanager
def decoding():
    """Forwards inside this block are decode steps: layers with a quantized copy use it."""
    token = _DECODING.set(True)
    try:
        yield
    finally:
        _DECODING.reset(token)


def kind_of(model: nn.Module) -> str:
    """What the model's decode steps read: "float" (no copies), "int8" or "int4" (use_decode_weights)."""
    for m in model.modules():
        if isinstance(m, DecodeLinear):
            return m.kind
    return "float"


def _quantize_int8(weight: torch.Tensor, block: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
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


def _fit_levels(groups: torch.Tensor, lo: torch.Tensor, span: torch.Tensor, levels: torch.Tensor):
    """Groups (n, g) on a grid of `levels` (n, 1) steps from their least value over their span: their levels
    q (n, g), the step (n, 1), and whether each group lies on that grid (n,)."""
    step = torch.where(span > 0, span / levels, torch.zeros_like(span))  # (n, 1); 0: a constant group
    q = torch.round((groups - lo) / step.clamp(min=1e-30))  # (n, g)
    # within a tenth of a step of its level, plus the bf16 rounding of it (weights stored in bf16)
    over = (lo + step * q - groups).abs() - groups.abs() * 2.0**-8  # (n, g)
    ok = (over.amax(-1, keepdim=True) <= 0.1 * step).squeeze(-1) & (q.amax(-1) <= 15)  # (n,)
    return q, step, ok


def _level_candidates(groups: torch.Tensor, span: torch.Tensor) -> list[torch.Tensor]:
    """For groups (n, g) that a span of 15 steps did not fit, the numbers of steps (n, 1) their span may be,
    most likely first: span / (the smallest gap between distinct values), rounded, and one less (bf16
    rounding can shrink that gap); then every number from 14 down to 1 (a group of few distinct values)."""
    gaps = groups.sort(-1).values.diff(dim=-1)  # (n, g-1)
    gaps = torch.where(gaps > span * 1e-3, gaps, torch.full_like(gaps, float("inf")))
    estimate = torch.round(span / gaps.amin(-1, keepdim=True))  # (n, 1)
    return [estimate.clamp(1, 15), (estimate - 1).clamp(1, 15)] + [
        torch.full_like(span, float(levels)) for levels in range(14, 0, -1)
    ]


def _grid4_block(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """One block of rows (b, in) float32 -> its 4-bit grid (q (b, in) in 0..15, step (b, G), offset (b, G)
    with w = offset + step * q), or None when some group of `group` inputs does not lie on one.

    A group lies on a grid whose offset is its least value and whose step is its span over a whole number
    of steps up to 15. A Q4 block uses its whole range most often, so 15 is tried on every group first, and
    the other candidates only on the groups it did not place."""
    b, width = w.shape
    groups = w.reshape(-1, group)  # (n, g), n = b * in / g
    lo = groups.amin(-1, keepdim=True)  # (n, 1)
    span = groups.amax(-1, keepdim=True) - lo
    q, step, ok = _fit_levels(groups, lo, span, torch.full_like(span, 15.0))
    todo = (~ok).nonzero().squeeze(-1)  # the groups still unplaced
    if todo.numel():
        rest = torch.arange(todo.numel())  # their rows in the candidates' tensors
        for levels in _level_candidates(groups[todo], span[todo]):
            q_try, step_try, ok = _fit_levels(groups[todo], lo[todo], span[todo], levels[rest])
            q[todo[ok]], step[todo[ok]] = q_try[ok], step_try[ok]
            todo, rest = todo[~ok], rest[~ok]
            if todo.numel() == 0:
                break
        else:
            return None
    return q.view(b, width).to(torch.int32), step.view(b, -1), lo.view(b, -1)


def grid4(weight: torch.Tensor, group: int = GROUP, block: int = 4096):
    """(out, in) float -> the 4-bit form the CPU kernel reads (packed weight, (in/group, out, 2) bf16 scales
    and offsets), when every group of `group` consecutive inputs of every row lies on a 4-bit grid; else
    None. `block` rows at a time, stopping at the first block off the grid, after a probe of 16 rows."""
    out_features, in_features = weight.shape
    if in_features % group or out_features % 16:  # the kernel's packing takes whole tiles
        return None
    if _grid4_block(weight[:16].detach().float(), group) is None:  # most layers off the grid fail here
        return None
    q = torch.empty(weight.shape, dtype=torch.int32)
    sz = torch.empty(in_features // group, out_features, 2, dtype=torch.float32)
    for lo in range(0, out_features, block):
        fit = _grid4_block(weight[lo : lo + block].detach().float(), group)
        if fit is None:
            return None
        q[lo : lo + block], step, offset = fit
        # the kernel computes (q - 8) * scale + zero
        sz[:, lo : lo + block, 0] = step.T
        sz[:, lo : lo + block, 1] = (offset + 8 * step).T
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    return packed, sz.to(torch.bfloat16).contiguous()


class DecodeLinear(nn.Linear):
    """`nn.Linear` whose few-row CPU forwards inside `decoding()` multiply its quantized copy."""

    kind: str = "int8"  # the model-wide choice, "int8" or "int4"; this layer's own copy is `bits` wide
    bits: int = 8
    qweight: torch.Tensor  # 8 bits: (out, in) int8; 4 bits: the kernel's packing. Non-persistent buffers,
    qscale: torch.Tensor  # 8 bits: (out,) bf16; 4 bits: (in/GROUP, out, 2) bf16 scales and offsets
    few_rows: int = FEW_ROWS  # rows up to which the copy is used

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not _DECODING.get() or rows > self.few_rows or x.device.type != "cpu":
            return self.float_forward(x)
        flat = x.reshape(rows, x.shape[-1]).to(torch.bfloat16)  # (R, in); the product is (R, out)
        if self.bits == 4:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.qweight, GROUP, self.qscale)
        else:
            out = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.qscale)
        out = out.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def float_forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.Linear.forward(self, x)


class DecodeHead(DecodeLinear):
    """The output layer: its copy on few rows, else the few-rows float product (head.py) or the plain one."""

    def float_forward(self, x: torch.Tensor) -> torch.Tensor:
        return FewRowsLinear.forward(self, x)


def _read_copies(path: Path) -> dict[str, torch.Tensor] | None:
    """The copies kept in `path` by an earlier load of the same model, or None (missing or unreadable: they
    are made again)."""
    try:
        return load_file(path)
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        if path.exists():
            log.warning("decode weight copies in %s unreadable (%s): making them again", path, e)
        return None


def _keep_copies(path: Path, copies: dict[str, torch.Tensor]) -> None:
    """Write the copies to `path` through a temp file and one rename; a home we cannot write to only means
    they are made again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        save_file(copies, tmp)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not keep the decode weight copies in %s: %s", path, e)


def use_decode_weights(model: nn.Module, kind: str = "int8", keep: Path | None = None) -> int:
    """Give every linear layer of the model a quantized copy for decode steps ("int8", or "int4" where the
    weights lie on a 4-bit grid and int8 elsewhere); returns how many layers got one (0 when the model has
    these copies already).

    The model's weights, state dict and fingerprint are unchanged (the copies are non-persistent buffers).
    With `keep` (a file named by the model's fingerprint and `kind`) the copies of a model of more than
    `KEEP_WEIGHTS` weights are read from there when an earlier load wrote them, else made and written there:
    making the 4-bit ones takes half a minute for a 1.5B model on 2 cores, reading them a second.
    Refused off the CPU (the kernels are CPU ones), and on a model that has the other kind of copies
    (drop_decode_weights first)."""
    if kind not in WEIGHTS[1:]:
        raise ValueError(f"unknown decode weights {kind!r}: use one of {', '.join(WEIGHTS[1:])}")
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ModelError(f"{kind} decode weights run on the CPU only (the model is on {device})")
    missing = [op for op in KERNELS[kind] if not hasattr(torch.ops.aten, op)]
    if missing:
        raise ModelError(
            f"{kind} decode weights need PyTorch's CPU kernel {missing[0]}, which torch "
            f"{torch.__version__} lacks: use --decode-weights float, or a newer torch"
        )
    if kind_of(model) == kind:
        return 0
    if kind_of(model) != "float":
        raise ModelError(f"the model decodes with {kind_of(model)} weights already: load it again for {kind}")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    layers = [
        (name, m)
        for name, m in model.named_modules()
        # an adapter's own low-rank layers stay float: they are small and delicate
        if type(m) in (nn.Linear, FewRowsLinear) and "lora_" not in name
    ]
    weights = sum(m.weight.numel() for _, m in layers)
    keep = keep if weights > KEEP_WEIGHTS else None
    kept = _read_copies(keep) if keep is not None else None
    if kept is None and weights > KEEP_WEIGHTS:
        log.warning("making %s copies of %.2fB weights for decode steps", kind, weights / 1e9)
    made = 0
    for name, module in layers:
        if kept is not None and f"{name}.qweight" in kept and f"{name}.qscale" in kept:
            packed, sz = kept[f"{name}.qweight"], kept[f"{name}.qscale"]
        else:
            four = grid4(module.weight) if kind == "int4" else None
            packed, sz = four if four is not None else _quantize_int8(module.weight)
            made += 1
        bits = 8 if packed.dtype == torch.int8 else 4  # int8: (out, in) int8; 4 bits: the kernel's uint8
        module.register_buffer("qweight", packed, persistent=False)
        module.register_buffer("qscale", sz, persistent=False)
        module.__class__ = DecodeHead if module is head else DecodeLinear
        module.kind, module.bits = kind, bits
        bf16 = module.weight.dtype == torch.bfloat16
        module.few_rows = FEW_ROWS_INT4 if bits == 4 else FEW_ROWS_BF16 if bf16 else FEW_ROWS
    if keep is not None and made:
        copies = {f"{n}.{b}": getattr(m, b).contiguous() for n, m in layers for b in ("qweight", "qscale")}
        _keep_copies(keep, copies)
    return len(layers)


def drop_decode_weights(model: nn.Module) -> int:
    """Take the quantized copies off the model's layers (for a bench that compares kinds on one model);
    returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, DecodeLinear):
            del module.qweight, module.qscale
            module.__class__ = FewRowsLinear if isinstance(module, DecodeHead) else nn.Linear
            count += 1
    return count


def copy_bytes(module: DecodeLinear) -> int:
    """Bytes a product with the layer's copy reads: the quantized weight and its scales."""
    return module.qweight.numel() * module.qweight.element_size() + module.qscale.numel() * 2


def dequantized(module: DecodeLinear) -> torch.Tensor:
    """The weight the quantized product computes with, (out, in) fp32: for tests and error reports."""
    if module.bits == 4:
        eye = torch.eye(module.in_features, dtype=torch.bfloat16)  # (in, in): the product's columns, exactly
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, module.qweight, GROUP, module.qscale).float().T
    return module.qweight.float() * module.qscale.float()[:, None]
