"""Does recomputing only the top layers of the context, across chunks, recover turbo's accuracy?

Turbo's chunk caches were each computed alone, so no context token attended across chunks in any layer.
A middle road: keep each chunk's hidden state at the input of layer L (computed alone, like its cache),
and at query time run layers L .. end over the whole context at once, with cross-chunk attention, on top
of the stored K/V of layers 0 .. L-1. Its cost is (layers - L) / layers of a full prefill of the context.

For every record this answers greedily in `full`, `turbo` and this `deep-L` for each L given, with one
greedy loop (so the three differ only in their caches), and prints accuracy and the paired counts:

    python -m turborag_research.experiments.deep_layers turborag_research/data/topic_train.jsonl \\
        --model qwen2.5-coder-1.5b --layers 20,24 --limit 30 --store /tmp/deep-store --out deep.jsonl

Our own data only: never RGB or the other evaluation-only sets.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch

from turborag.core import hf_compat, kv, recompute
from turborag.core.generate import SamplingParams
from turborag.eval.evaluate import load_examples
from turborag.eval.metrics import contains_answer, paired_difference
from turborag.rag.engines import scratch_engine
from turborag.store.chunk_kv import ChunkKV


@contextlib.contextmanager
def layers_from(model: torch.nn.Module, start: int, end: int | None = None):
    """Run only decoder layers start .. end - 1 inside this block (each keeps its own cache index)."""
    inner = model.model
    saved = inner.layers
    inner.layers = torch.nn.ModuleList(list(saved)[start:end])
    try:
        yield
    finally:
        inner.layers = saved


@torch.inference_mode()
def chunk_hidden(engine, chunk: list[int], layers: list[int]) -> dict[int, torch.Tensor]:
    """The chunk's hidden states at the input of each layer in `layers`, computed behind the prefix at
    positions [p, p + n) as its cache is: {layer: (n, hidden)}."""
    model, dev = engine.lm.model, engine.lm.device
    p = engine.prefix_kv.tokens
    cache = kv.to_cache([engine.prefix_kv.to(dev, engine.lm.dtype)])
    ids = torch.tensor([chunk], device=dev)  # (1, n)
    pos = torch.arange(p, p + len(chunk), device=dev)[None]  # (1, n)
    kw = {hf_compat._cache_kwarg(type(model)): cache}
    out = model(
        input_ids=ids, position_ids=pos, use_cache=True, output_hidden_states=True, logits_to_keep=1, **kw
    )
    return {L: out.hidden_states[L][0] for L in layers}


@torch.inference_mode()
def deep_tail(engine, cache, hidden: torch.Tensor, p: int, start: int, end: int | None = None) -> None:
    """Replace the context K/V of layers start .. end - 1 by a forward of those layers over `hidden`
    (1, C, H), the context's hidden states at layer `start`, all chunks at once at positions p .. p + C - 1.
    Layers from `end` on keep their stale context K/V."""
    model, dev = engine.lm.model, engine.lm.device
    for layer in cache.layers[start:end]:
        layer.length = p  # keep the prefix, drop the stale context
        layer._views()
    c = hidden.shape[1]
    pos = torch.arange(p, p + c, device=dev)[None]  # (1, C)
    causal = torch.ones(c, c, dtype=torch.bool, device=dev).tril()  # (C, C)
    mask = torch.cat([torch.ones(c, p, dtype=torch.bool, device=dev), causal], dim=1)[None, None]
    kw = {hf_compat._cache_kwarg(type(model)): cache}
    with layers_from(model, start, end):
        model(
            inputs_embeds=hidden,
            position_ids=pos,
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=1,
            **kw,
        )


def oracle_tokens(turbo_cache, full_cache, p: int, n: int, start: int, ratio: float) -> list[int]:
    """Oracle: the `ratio` share of context indices whose K/V in layers start .. end deviates most from
    full's (summed L2 norms over heads and layers)."""
    score = torch.zeros(n - p)
    for t, f in zip(turbo_cache.layers[start:], full_cache.layers[start:]):
        score += (t.keys[0, :, p:n] - f.keys[0, :, p:n]).float().norm(dim=-1).sum(0)
        score += (t.values[0, :, p:n] - f.values[0, :, p:n]).float().norm(dim=-1).sum(0)
    top = torch.topk(score, max(1, round(ratio * (n - p)))).indices + p
    return sorted(top.tolist())


def swap_tokens(turbo_cache, full_cache, idx: list[int], start: int) -> None:
    """Oracle: full's K/V for cache indices `idx` in layers start .. end."""
    i = torch.tensor(idx)
    for t, f in zip(turbo_cache.layers[start:], full_cache.layers[start:]):
        t.keys[:, :, i] = f.keys[:, :, i]
        t.values[:, :, i] = f.values[:, :, i]


@torch.inference_mode()
def filler_context(engine, prompt, filler: list[int]):
    """Turbo's context, but every chunk computed behind the prefix AND a fixed unrelated filler text (as if
    deep inside some document), then moved back to its place: the filler itself is dropped."""
    model, dev, dtype = engine.lm.model, engine.lm.device, engine.lm.dtype
    pre = engine.prefix_kv.to(dev, dtype)
    f = kv.precompute_chunks(model, pre, [filler])[0]  # (L, H, F, D) at positions p .. p + F
    base = ChunkKV(torch.cat([pre.k, f.k], dim=2), torch.cat([pre.v, f.v], dim=2))
    chunks = kv.precompute_chunks(model, base, prompt.chunks)  # each at p + F .. p + F + n
    moved = [ChunkKV(kv.rotate_keys(c.k, -len(filler), engine.inv_freq), c.v) for c in chunks]
    return kv.assemble(pre, moved, engine.inv_freq)  # (cache, position of the question)


def swap_band(turbo_cache, full_cache, p: int, n: int, start: int, end: int) -> None:
    """Oracle: the context K/V (cache indices p .. n - 1) of layers start .. end - 1 taken from full's."""
    for i in range(start, end):
        t, f = turbo_cache.layers[i], full_cache.layers[i]
        t.keys[:, :, p:n] = f.keys[:, :, p:n]
        t.values[:, :, p:n] = f.values[:, :, p:n]


@torch.inference_mode()
def greedy(engine, cache, ids: list[int], start: int, max_new: int = 32) -> str:
    """Feed `ids` at positions start.., then decode greedily until an end of turn or a newline."""
    model, dev, tok = engine.lm.model, engine.lm.device, engine.lm.tokenizer
    out: list[int] = []
    pos = start
    while len(out) < max_new:
        x = torch.tensor([ids], device=dev)
        logits = hf_compat.forward(
            model, x, torch.arange(pos, pos + len(ids), device=dev)[None], cache, logits_to_keep=1
        )
        pos += len(ids)
        t = int(logits[0, -1].argmax())
        if t in engine.stop_ids:
            break
        out.append(t)
        text = tok.decode(out, skip_special_tokens=True)
        if "\n" in text.strip():
            break
        ids = [t]
    return tok.decode(out, skip_special_tokens=True).strip().split("\n")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--layers", default="20,24", help="comma-separated L: recompute layers L .. end")
    ap.add_argument("--bands", default="", help="comma-separated a-b: recompute layers a .. b-1 only")
    ap.add_argument("--swaps", default="", help="comma-separated a-b: oracle, full's K/V in layers a .. b-1")
    ap.add_argument(
        "--oracle",
        default="",
        help="comma-separated R: the R most-deviating tokens (by full's "
        "K/V in layers 14 on): swapped in from full there (odev-R), or recomputed (rblend-R)",
    )
    ap.add_argument("--blend", default="", help="comma-separated R: the engine's turbo-blend at ratio R")
    ap.add_argument(
        "--filler-line", type=int, default=0, help="a record of DATA whose passages are the filler"
    )
    ap.add_argument("--filler-tokens", default="", help="comma-separated filler lengths in tokens")
    ap.add_argument("--limit", type=int, default=30)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="one JSON line per record")
    args = ap.parse_args()
    starts = [int(x) for x in args.layers.split(",") if x]
    bands = [tuple(int(y) for y in x.split("-")) for x in args.bands.split(",") if x]
    swaps = [tuple(int(y) for y in x.split("-")) for x in args.swaps.split(",") if x]
    engine = scratch_engine(args.model, "cpu", args.store, "auto", "auto")
    examples = load_examples(args.data, args.skip + args.limit)[0][args.skip :]
    params = SamplingParams(max_new_tokens=32, stop_at_newline=True)
    names = ["full", "turbo"] + [f"deep-{L}" for L in starts]
    names += [f"band-{a}-{b}" for a, b in bands] + [f"swap-{a}-{b}" for a, b in swaps]
    fillers = [int(x) for x in args.filler_tokens.split(",") if x]
    filler_ids: list[int] = []
    if fillers:
        rec = load_examples(args.data, args.filler_line)[0][-1]
        filler_ids = engine.lm.tokenizer.encode("\n\n".join(rec.contexts), add_special_tokens=False)
        assert len(filler_ids) >= max(fillers), f"the filler has {len(filler_ids)} tokens"
    names += [f"filler-{n}" for n in fillers]
    oracles = [float(x) for x in args.oracle.split(",") if x]
    blends = [float(x) for x in args.blend.split(",") if x]
    names += (
        [f"odev-{r}" for r in oracles] + [f"rblend-{r}" for r in oracles] + [f"blend-{r}" for r in blends]
    )
    right: dict[str, list[bool]] = {n: [] for n in names}
    same: dict[str, list[bool]] = {n: [] for n in names}
    tail_s: dict[int, list[float]] = {L: [] for L in starts}
    full_s: list[float] = []
    sink = args.out.open("a") if args.out else None
    for n, ex in enumerate(examples):
        prompt = engine.check_fits(ex.question, ex.contexts, params)
        p = len(prompt.prefix)
        answers: dict[str, str] = {}
        cache = hf_compat.buffered_cache(engine.lm.config.num_hidden_layers, reserve=64)
        t0 = time.perf_counter()
        answers["full"] = greedy(engine, cache, prompt.ids, 0)
        full_s.append(time.perf_counter() - t0)
        ctx = engine.assemble(prompt, "turbo", 64)
        answers["turbo"] = greedy(engine, ctx.cache, prompt.suffix, ctx.next_pos)
        n_ctx = p + prompt.context_tokens
        for a, b in swaps:
            ctx = engine.assemble(prompt, "turbo", 64)
            swap_band(ctx.cache, cache, p, n_ctx, a, b)
            answers[f"swap-{a}-{b}"] = greedy(engine, ctx.cache, prompt.suffix, ctx.next_pos)
        for f in fillers:
            fcache, fpos = filler_context(engine, prompt, filler_ids[:f])
            answers[f"filler-{f}"] = greedy(engine, fcache, prompt.suffix, fpos)
        for r in oracles:
            turbo = engine.assemble(prompt, "turbo", 64)
            idx = oracle_tokens(turbo.cache, cache, p, n_ctx, 14, r)
            ctx = engine.assemble(prompt, "turbo", 64)
            swap_tokens(ctx.cache, cache, idx, 14)
            answers[f"odev-{r}"] = greedy(engine, ctx.cache, prompt.suffix, ctx.next_pos)
            ctx = engine.assemble(prompt, "turbo", 64)
            ids = prompt.prefix + [t for c in prompt.chunks for t in c]
            recompute.recompute(engine.lm.model, ctx.cache, ids, list(range(n_ctx)), idx)
            answers[f"rblend-{r}"] = greedy(engine, ctx.cache, prompt.suffix, ctx.next_pos)
        for r in blends:
            variant = engine.with_options(recompute_ratio=r)
            ctx = variant.assemble(prompt, "turbo-blend", 64)
            answers[f"blend-{r}"] = greedy(engine, ctx.cache, prompt.suffix, ctx.next_pos)
        if not starts and not bands:
            hidden = []
        else:
            hidden = [chunk_hidden(engine, c, starts + [a for a, _ in bands]) for c in prompt.chunks]
        for a, b in bands:
            ctx = engine.assemble(prompt, "turbo", 64)
            deep_tail(engine, ctx.cache, torch.cat([x[a] for x in hidden])[None], p, a, b)
            answers[f"band-{a}-{b}"] = greedy(engine, ctx.cache, prompt.suffix, ctx.next_pos)
        for L in starts:
            ctx = engine.assemble(prompt, "turbo", 64)
            h = torch.cat([x[L] for x in hidden])[None]  # (1, C, hidden)
            t0 = time.perf_counter()
            deep_tail(engine, ctx.cache, h, p, L)
            tail_s[L].append(time.perf_counter() - t0)
            answers[f"deep-{L}"] = greedy(engine, ctx.cache, prompt.suffix, ctx.next_pos)
        for name, a in answers.items():
            right[name].append(contains_answer(a, ex.answers))
            same[name].append(a == answers["full"])
        line = {"line": ex.line, "gold": ex.answers, **answers}
        print(n, json.dumps(line), flush=True)
        if sink:
            sink.write(json.dumps(line) + "\n")
            sink.flush()
    for name in names:
        acc = sum(right[name]) / len(right[name])
        only, only_full, pv = paired_difference(right[name], right["full"])
        vs_turbo = paired_difference(right[name], right["turbo"])
        print(
            f"{name:>8}: {acc:.1%}  vs full {only}/{only_full} (p {pv:.2f})",
            f"vs turbo {vs_turbo[0]}/{vs_turbo[1]}  identical to full {sum(same[name])}/{len(same[name])}",
        )
    full_med = sorted(full_s)[len(full_s) // 2]
    for L in starts:
        med = sorted(tail_s[L])[len(tail_s[L]) // 2]
        print(f"deep-{L} tail forward median {med:.2f} s; full prefill+decode median {full_med:.2f} s")


if __name__ == "__main__":
    main()
