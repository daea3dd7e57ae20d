"""Self-distillation: turbo learns to answer what the same model answers in `full` mode.

What turbo must do is answer as `full` does, so the teacher is the model itself reading the whole prompt in
one ordinary forward: no gold labels, and nothing the model knows is retrained, only how it reads chunk
caches computed blind to each other. For each example the teacher (the base model, adapter off) decodes
its greedy answer over the full prompt and keeps, at each answer position, its `top_k` likeliest next
tokens with their log-probabilities. The student reads the same passages as turbo serves them and is
trained, teacher-forced on that answer, to match those distributions (`distill_loss`).

Teachers are written to a JSONL file as they are computed, one line per example index, so a resumed run
(or another arm of a comparison, given the same file) never computes one twice.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from turborag.core import hf_compat, query_adapter
from turborag.core.prompt import PromptLayout

log = logging.getLogger(__name__)


@dataclass
class Teacher:
    """The full-prefill model's greedy answer to one example, with its top-k next-token distributions."""

    tokens: list[int]  # the answer, its stop token included when one was reached
    top_ids: list[list[int]]  # (A, k): the k likeliest tokens at the position predicting tokens[a]
    top_logprobs: list[list[float]]  # (A, k): their log-probabilities


@torch.no_grad()
def teach(
    model: torch.nn.Module,
    layout: PromptLayout,
    stop_ids: set[int],
    ex: dict,
    max_tokens: int,
    top_k: int,
    max_passage_tokens: int,
) -> Teacher:
    """The teacher of one example: greedy decoding over the full prompt (prefix + passages + question, one
    forward, the base model), as `full` mode serves it."""
    dev = next(model.parameters()).device
    chunks = [layout.chunk_ids(c)[:max_passage_tokens] for c in ex["contexts"]]
    ids = layout.prefix_ids() + [t for c in chunks for t in c] + layout.suffix_ids(ex["question"])
    cache = hf_compat.new_cache()
    with query_adapter.active(model, False):
        x = torch.tensor([ids], device=dev)  # (1, T)
        pos = torch.arange(len(ids), device=dev)[None]  # (1, T)
        logits = hf_compat.forward(model, x, pos, cache, logits_to_keep=1)  # (1, 1, vocab)
        tokens, top_ids, top_lp = [], [], []
        for _ in range(max_tokens):
            logp = logits[0, -1].float().log_softmax(-1)  # (vocab,)
            top = logp.topk(top_k)
            top_ids.append(top.indices.tolist())
            top_lp.append([round(v, 4) for v in top.values.tolist()])
            token = int(top.indices[0])
            tokens.append(token)
            if token in stop_ids:
                break
            x = torch.tensor([[token]], device=dev)  # (1, 1)
            pos = torch.tensor([[len(ids) + len(tokens) - 1]], device=dev)  # (1, 1)
            logits = hf_compat.forward(model, x, pos, cache, logits_to_keep=1)
    return Teacher(tokens, top_ids, top_lp)


def distill_loss(logits: torch.Tensor, teacher: Teacher) -> torch.Tensor:
    """KL(teacher || student) per answer position, averaged: `logits` (A, vocab) are the student's at the
    positions predicting teacher.tokens. Both distributions are read over k + 1 outcomes: the teacher's top
    k tokens and "any other token" (the teacher's remaining mass). That is exact where the teacher is known,
    and zero exactly when the student gives each of those tokens, and the rest together, what the teacher
    gives."""
    logp = logits.float().log_softmax(-1)  # (A, vocab)
    ids = torch.tensor(teacher.top_ids, device=logits.device)  # (A, k)
    t_top = torch.tensor(teacher.top_logprobs, device=logits.device)  # (A, k)
    t_rest = torch.log1p(-t_top.exp().sum(-1).clamp(max=1 - 1e-6))  # (A,)
    s_top = logp.gather(1, ids)  # (A, k)
    # finite even when the top k hold everything (then the teacher's rest is ~0 and so is its term)
    s_rest = logp.scatter(1, ids, float("-inf")).logsumexp(-1).clamp(min=-50.0)  # (A,)
    t = torch.cat([t_top, t_rest[:, None]], -1)  # (A, k + 1)
    s = torch.cat([s_top, s_rest[:, None]], -1)  # (A, k + 1)
    return (t.exp() * (t - s)).sum(-1).mean()


class TeacherFile:
    """Teachers by example index, kept in a JSONL file that grows as they are computed. A line cut short by
    a crash is ignored, and its teacher computed again."""

    def __init__(self, path: Path):
        self.path = path
        self.known: dict[int, Teacher] = {}
        if path.exists():
            text = path.read_text(encoding="utf-8")
            if not text.endswith("\n"):  # cut short: drop the partial line, so the next append starts clean
                text = text[: text.rfind("\n") + 1]
                path.write_text(text, encoding="utf-8")
            for line in text.splitlines():
                try:
                    row = json.loads(line)
                    i = row.pop("i")
                    self.known[i] = Teacher(**row)
                except (ValueError, TypeError, KeyError):
                    log.warning("%s: a damaged line skipped (its teacher is computed again)", path)

    def get(self, i: int, compute) -> Teacher:
        if i not in self.known:
            teacher = compute()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"i": i, **asdict(teacher)}) + "\n")
            self.known[i] = teacher
        return self.known[i]
