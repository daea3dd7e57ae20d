"""A context-side adapter trained to make each chunk's own cache look like full's, layer by layer.

deep_layers.py located turbo's loss on Qwen: taking full's context K/V in layers 14 on (and nothing else)
recovers it, while the question's side is not where it is lost. So this trains the chunk encoder, not the
reader: a LoRA adapter that is on only while a chunk's cache is computed (behind the prefix, alone, as turbo
computes it), with the loss the distance of that chunk's K/V in layers `--from-layer` on to the K/V the
frozen base model gives the same tokens in a full prefill of the whole context (keys moved back to the
chunk's own positions first). The question and `full` stay the base model. The signal is dense (every
context token, every layer from 14), and no teacher answer has to be decoded.

    python -m turborag_research.experiments.kv_match turborag_research/data/topic_train.jsonl \\
        --skip 300 --steps 40 --out /tmp/kvm      # then --eval 30: full, turbo, turbo with the adapter

Our own data only: never RGB or the other evaluation-only sets.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from turborag.core import hf_compat, kv
from turborag.core.generate import SamplingParams
from turborag.eval.evaluate import load_examples
from turborag.eval.metrics import contains_answer, paired_difference
from turborag.rag.engines import scratch_engine
from turborag.store.chunk_kv import ChunkKV
from turborag_research.experiments.deep_layers import greedy


def full_context(engine, prompt) -> ChunkKV:
    """The base model's K/V of prefix + chunks in one prefill: (L, H, N, D)."""
    ids = prompt.prefix + [t for c in prompt.chunks for t in c]
    with engine.lm.model.disable_adapter():
        kv_all = kv.prefill_prefix(engine.lm.model, ids)
    return ChunkKV(kv_all.k.clone(), kv_all.v.clone())  # out of inference mode: targets of a loss


def chunk_loss(engine, prefix: ChunkKV, prompt, teacher: ChunkKV, start: int) -> torch.Tensor:
    """Mean over chunks and layers start.. of the relative squared distance of the adapted chunk's K/V to
    full's for the same tokens (teacher keys rotated back by the chunk's shift)."""
    p = len(prompt.prefix)
    shifts, _ = kv.layout([len(c) for c in prompt.chunks], p)
    inv = engine.inv_freq[start:]
    losses = []
    for c, d in zip(prompt.chunks, shifts):
        got = kv.precompute_chunks(engine.lm.model, prefix, [c], grad=True)[0]  # (L, H, n, D)
        s, e = p + d, p + d + len(c)
        tk = teacher.k[start:, :, s:e].float()  # (L', H, n, D)
        tv = teacher.v[start:, :, s:e].float()
        tk = kv.rotate_keys(tk, -d, inv)
        for a, b in ((got.k[start:].float(), tk), (got.v[start:].float(), tv)):
            losses.append(((a - b) ** 2).sum(-1).mean() / (b**2).sum(-1).mean())
    return torch.stack(losses).mean()


def turbo_context(engine, prefix: ChunkKV, prompt):
    """Turbo's context, every chunk computed alone behind the prefix (with the adapter if it is on)."""
    chunks = kv.precompute_chunks(engine.lm.model, prefix, prompt.chunks)
    return kv.assemble(prefix, chunks, engine.inv_freq)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--skip", type=int, default=300, help="training records start here")
    ap.add_argument("--steps", type=int, default=40, help="one record a step")
    ap.add_argument("--from-layer", type=int, default=14)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eval", type=int, default=30, help="then answer the first N records")
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from peft import LoraConfig, get_peft_model

    engine = scratch_engine(args.model, "cpu", args.store, "auto", "auto")
    params = SamplingParams(max_new_tokens=32, stop_at_newline=True)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    cfg = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=targets, lora_dropout=0.0)
    engine.lm.model = get_peft_model(engine.lm.model, cfg)
    model = engine.lm.model
    for prm in model.parameters():  # LoRA in the model's dtype would round every update away
        if prm.requires_grad:
            prm.data = prm.data.float()
    prefix = engine.prefix_kv.to(engine.lm.device, engine.lm.dtype)
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "train.jsonl").open("a")
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=args.lr, weight_decay=0.0)
    train = load_examples(args.data, args.skip + args.steps)[0][args.skip :]
    for step, ex in enumerate(train, 1):
        t0 = time.perf_counter()
        prompt = engine.check_fits(ex.question, ex.contexts, params)
        teacher = full_context(engine, prompt)
        loss = chunk_loss(engine, prefix, prompt, teacher, args.from_layer)
        loss.backward()
        opt.step()
        opt.zero_grad()
        row = {"step": step, "loss": round(loss.item(), 5), "s": round(time.perf_counter() - t0, 1)}
        print(json.dumps(row), flush=True)
        log.write(json.dumps(row) + "\n")
        log.flush()
    model.save_pretrained(args.out / "adapter")

    examples = load_examples(args.data, args.eval)[0]
    right: dict[str, list[bool]] = {"full": [], "turbo": [], "adapted": []}
    sink = (args.out / "eval.jsonl").open("w")
    for ex in examples:
        prompt = engine.check_fits(ex.question, ex.contexts, params)
        answers = {}
        with model.disable_adapter():
            cache = hf_compat.buffered_cache(engine.lm.config.num_hidden_layers, reserve=64)
            answers["full"] = greedy(engine, cache, prompt.ids, 0)
            cache, pos = turbo_context(engine, prefix, prompt)
            answers["turbo"] = greedy(engine, cache, prompt.suffix, pos)
        cache, pos = turbo_context(engine, prefix, prompt)
        with model.disable_adapter():
            answers["adapted"] = greedy(engine, cache, prompt.suffix, pos)
        for k, a in answers.items():
            right[k].append(contains_answer(a, ex.answers))
        print(json.dumps({"line": ex.line, **answers}), flush=True)
        sink.write(json.dumps({"line": ex.line, "gold": ex.answers, **answers}) + "\n")
    for k, r in right.items():
        only, only_full, pv = paired_difference(r, right["full"])
        print(f"{k}: {sum(r) / len(r):.1%}  vs full {only}/{only_full} (p {pv:.2f})")
    print("adapted vs turbo", paired_difference(right["adapted"], right["turbo"]))


if __name__ == "__main__":
    main()
