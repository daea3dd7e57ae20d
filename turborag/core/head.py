"""The output layer for a few rows on a CPU: `W @ x.T` instead of `x @ W.T`.

A language model's output layer is a (vocab, hidden) matrix: 262,144 x 640 for Gemma 3, 671 MB in fp32.
It runs on a handful of rows at a time when serving: the question's last token and, with an abstention
threshold, the scored reply's tokens (6 rows), or one row per sequence in a batched decode step. For such
rows torch's CPU matmul computes `x @ W.T` (what `nn.Linear` does) 2-3x slower than `W @ x.T`, which is the
same product: fp32 on 2 AVX2 cores, 6 rows 136 ms against 58 ms, 8 rows 122 ms against 55 ms, one row 44 ms
either way (turborag_research/notes/2026-12-05-output-layer.md). A product with one row runs on one thread,
so the vocabulary is split
into one block per thread (a batched product): one row 46 ms -> 25 ms on 2 cores, a decode step's
output layer. The hidden layers' matrices showed no such gap, so only the output layer
is changed, and only for CPU inputs of at most `FEW_ROWS` rows; the weights (tied to the embeddings in
Gemma) and the state dict stay as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FEW_ROWS = 64


class FewRowsLinear(nn.Linear):
    """`nn.Linear` whose forward on a few CPU rows multiplies the weight by the rows' transpose."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows > FEW_ROWS or x.device.type != "cpu" or self.bias is not None:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, x.shape[-1])  # (R, H)
        vocab, hidden = self.weight.shape
        blocks = torch.get_num_threads()
        if blocks > 1 and vocab % blocks == 0:
            # one block of the vocabulary per thread: a one-row product is otherwise single-threaded
            parts = self.weight.view(blocks, vocab // blocks, hidden)  # (T, V/T, H)
            out = torch.bmm(parts, flat.T.expand(blocks, hidden, rows)).reshape(vocab, rows)  # (V, R)
        else:
            out = self.weight @ flat.T  # (V, H) @ (H, R) -> (V, R)
        return out.T.contiguous().reshape(*x.shape[:-1], vocab)  # (..., V)


def use_few_rows_head(model: nn.Module) -> bool:
    """Give the model's output layer the few-rows forward (its class only: same weights, same state dict).
    Returns whether it did: a model whose output layer is not a plain `nn.Linear` is left alone."""
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear:
        return False
    head.__class__ = FewRowsLinear
    return True
