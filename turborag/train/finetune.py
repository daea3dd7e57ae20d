"""Cache-aware fine-tuning (TurboRAG's recipe): training is serving with gradients.

For each example the loss is computed by the serving path itself with autograd on:
prefix K/V -> each chunk's K/V behind the prefix (`kv.precompute_chunks`) -> re-positioned and assembled
(`kv.assemble`) -> question + answer on top -> cross-entropy on the answer tokens only. So every chunk
attends only to the prefix and itself (the independent-attention mask), the question and answer attend to
everything, and positions are exactly what serving uses; training and serving cannot drift.

`causal=True` trains the same model the ordinary way (whole prompt, causal mask): the fair "naive RAG"
baseline the paper compares against.

LoRA (peft) by default, full fine-tuning as an option. With `dtype="bfloat16"` (the default where the hardware
has bf16 matmuls) the frozen base weights are bf16 while the LoRA weights, their gradients and the AdamW state
stay fp32 (peft's `autocast_adapter_dtype`): the big matmuls run at bf16 speed (see BENCHMARKS, "Fine-tuning
speed") and the small updates are not rounded away. Full fine-tuning keeps everything in fp32.

Checkpoints (adapter or weights + AdamW state as
safetensors, never pickle) every `save_every` steps; a killed run resumes from the latest one and sees the
same data stream, because example order is a pure function of (seed, step).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from turborag.core import hf_compat, kv, query_adapter
from turborag.core.arch import end_of_turn_ids, family, layer_inv_freq
from turborag.core.model import LoadedModel
from turborag.core.progress import progress_bar
from turborag.core.prompt import PromptLayout, answer_ids
from turborag.train.distill import Teacher, TeacherFile, distill_loss, teach

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    data: str
    out: str
    model: str = "gemma-3-270m"  # fine-tunes start from the base model
    lora: bool = True
    causal: bool = False
    positions: str = "reordered"
    steps: int = 500
    batch: int = 4  # examples per optimizer step (gradient accumulation)
    lr: float = 2e-4
    rank: int = 16
    alpha: int = 32
    warmup: int = 20
    seed: int = 0
    save_every: int = 25
    template: str = "auto"
    max_passage_tokens: int = 256  # longer passages are truncated (keeps step time bounded)
    dtype: str = "float32"  # compute dtype of the frozen base weights (LoRA weights stay fp32)
    keep_every: int = 0  # also keep the adapter every N steps under snapshots/ (for a learning curve)
    init_adapter: str | None = None  # start from this LoRA adapter's weights instead of zero (a second stage)
    recipe: str | None = None  # the recipe (train/recipe.py) the run comes from, recorded with the adapter
    recipe_hash: str | None = None  # and its hash: which version of that recipe
    # "answer": cross-entropy on the data's answer; "distill": match the model's own full-prefill answer and
    # next-token distributions (train/distill.py), no labels needed
    objective: str = "answer"
    # "both": the chunk caches pass through the adapter too (TurboRAG's fine-tune; a store must be recomputed
    # for it); "query": only the question and answer tokens do, the caches are the frozen base's
    # (core/query_adapter.py), so one store serves the base and the adapter
    side: str = "both"
    teacher: str | None = None  # the distillation teachers' JSONL (default OUT/teacher.jsonl): reusable
    teacher_tokens: int = 48  # the teacher's greedy answer is cut at this many tokens
    teacher_top_k: int = 16  # next-token candidates of the teacher kept per answer position


# ---------------------------------------------------------------------------------------------------------
# the loss = the serving path with gradients


def serving_logits(
    model: torch.nn.Module,
    inv_freq: torch.Tensor,  # (layers, head_dim/2)
    prefix: list[int],
    chunks: Sequence[list[int]],
    tail: list[int],  # question suffix + answer tokens
    causal: bool = False,
    positions: str = "reordered",
) -> torch.Tensor:
    """Logits (len(tail), vocab) for `tail`, computed exactly as serving computes them (with autograd).

    turbo: prefix K/V, chunk K/V behind it (independent), re-positioned, then the tail on top.
    causal: one ordinary forward over prefix + chunks + tail (what `full` mode serves).
    """
    dev = next(model.parameters()).device
    if causal:
        ids = prefix + [t for c in chunks for t in c] + tail
        x = torch.tensor([ids], device=dev)  # (1, T)
        logits = hf_compat.forward(model, x, torch.arange(len(ids), device=dev)[None], hf_compat.new_cache())
        return logits[0, -len(tail) :]
    prefix_kv = kv.prefill_prefix(model, prefix, grad=True)
    chunk_kv = kv.precompute_chunks(model, prefix_kv, chunks, batch_size=len(chunks), grad=True)
    return _tail_logits(model, inv_freq, prefix_kv, chunk_kv, tail, positions)


def _tail_logits(model, inv_freq, prefix_kv, chunk_kv, tail: list[int], positions: str) -> torch.Tensor:
    """The prefix and chunk caches assembled as serving assembles them, then `tail` on top: its logits
    (len(tail), vocab)."""
    dev = next(model.parameters()).device
    cache, next_pos = kv.assemble(prefix_kv, chunk_kv, inv_freq, positions)
    x = torch.tensor([tail], device=dev)  # (1, S)
    pos = torch.arange(next_pos, next_pos + len(tail), device=dev)[None]  # (1, S)
    return hf_compat.forward(model, x, pos, cache)[0]


def query_side_logits(
    model: torch.nn.Module,
    inv_freq: torch.Tensor,  # (layers, head_dim/2)
    prefix: list[int],
    chunks: Sequence[list[int]],
    tail: list[int],  # question suffix + answer tokens
    positions: str = "reordered",
) -> torch.Tensor:
    """`serving_logits` of turbo with a query-side adapter: the prefix and chunk caches are the frozen base's
    (adapter off, no grad: constants of the graph, exactly as a store serves them), and only `tail` runs
    through the adapter with autograd. Backpropagation covers the tail's tokens only."""
    with torch.no_grad(), query_adapter.active(model, False):
        prefix_kv = kv.prefill_prefix(model, prefix)
        chunk_kv = kv.precompute_chunks(model, prefix_kv, chunks, batch_size=len(chunks))
    with query_adapter.active(model, True):
        return _tail_logits(model, inv_freq, prefix_kv, chunk_kv, tail, positions)


def student_logits(model, inv_freq, layout: PromptLayout, chunks, tail: list[int], cfg: TrainConfig):
    """The logits the trained model serves for `tail` on top of `chunks`, as `cfg.side` trains them."""
    prefix = layout.prefix_ids()
    if cfg.side == "query":
        return query_side_logits(model, inv_freq, prefix, chunks, tail, cfg.positions)
    on = query_adapter.active(model, True) if query_adapter.attached(model) else contextlib.nullcontext()
    with on:
        return serving_logits(model, inv_freq, prefix, chunks, tail, cfg.causal, cfg.positions)


def example_loss(
    model, inv_freq, layout: PromptLayout, ex: dict, cfg: TrainConfig, teacher: Teacher | None = None
) -> tuple[torch.Tensor, int]:
    """One example's loss and its answer tokens: the mean cross-entropy over the data's answer, or with a
    `teacher` (objective "distill") the mean KL to the full-prefill model over the teacher's answer."""
    chunks = [layout.chunk_ids(c)[: cfg.max_passage_tokens] for c in ex["contexts"]]
    suffix = layout.suffix_ids(ex["question"])
    target = teacher.tokens if teacher is not None else answer_ids(layout.tokenizer, ex["answers"][0])
    # logits at position j predict tail[j + 1]: the answer's first token is predicted at len(suffix) - 1,
    # and its last token is never fed
    tail = suffix + target[:-1]
    pred = student_logits(model, inv_freq, layout, chunks, tail, cfg)[len(suffix) - 1 :]  # (A, vocab)
    if teacher is not None:
        return distill_loss(pred, teacher), len(target)
    return F.cross_entropy(pred.float(), torch.tensor(target, device=pred.device)), len(target)


# ---------------------------------------------------------------------------------------------------------
# data, checkpoints


def load_train_data(path: str | Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            if not obj.get("question") or not obj.get("answers") or not obj.get("contexts"):
                raise ValueError(f"{path}:{n}: needs question, answers and contexts")
            rows.append(obj)
    if not rows:
        raise ValueError(f"{path}: no training examples")
    return rows


def batch_for_step(n_examples: int, step: int, batch: int, seed: int) -> list[int]:
    """Example indices of a step: epoch-wise shuffles, a pure function of (seed, step) so resume is exact."""
    out = []
    for i in range(step * batch, (step + 1) * batch):
        epoch, j = divmod(i, n_examples)
        order = list(range(n_examples))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(order[j])
    return out


def _trainable(model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(
    out: Path, step: int, model, opt: torch.optim.Optimizer, cfg: TrainConfig, losses: list
) -> None:
    """Write ckpt-<step> fully, then point `latest` at it (atomic rename), then drop older checkpoints."""
    params = _trainable(model)
    tmp = out / f".ckpt-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({n: p.detach().cpu().contiguous() for n, p in params.items()}, tmp / "trainable.safetensors")
    state = {}
    name_of = {id(p): n for n, p in params.items()}
    for p, st in opt.state.items():
        n = name_of[id(p)]
        for k, v in st.items():
            state[f"{n}::{k}"] = (v if torch.is_tensor(v) else torch.tensor(v)).detach().cpu().contiguous()
    save_file(state, tmp / "optimizer.safetensors")
    (tmp / "state.json").write_text(json.dumps({"step": step, "config": asdict(cfg), "losses": losses}))
    final = out / f"ckpt-{step}"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = out / ".latest.tmp"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, out / "latest")
    for old in out.glob("ckpt-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)


def resume_step(out: str | Path) -> int:
    """The step a run in `out` resumes at: that of its latest checkpoint (0 when it has none)."""
    latest = Path(out) / "latest"
    return int(latest.read_text().strip().removeprefix("ckpt-")) if latest.exists() else 0


def load_checkpoint(out: Path, model, opt: torch.optim.Optimizer) -> tuple[int, list]:
    """Restore the latest checkpoint if any; returns (next step, loss history)."""
    latest = out / "latest"
    if not latest.exists():
        return 0, []
    ck = out / latest.read_text().strip()
    params = _trainable(model)
    weights = load_file(ck / "trainable.safetensors")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(weights[n])
    saved = load_file(ck / "optimizer.safetensors")
    for n, p in params.items():
        st = {k.split("::", 1)[1]: v for k, v in saved.items() if k.split("::", 1)[0] == n}
        if st:
            opt.state[p] = st
    meta = json.loads((ck / "state.json").read_text())
    return meta["step"], meta["losses"]


# ---------------------------------------------------------------------------------------------------------
# the loop


def prepare_model(lm: LoadedModel, cfg: TrainConfig) -> torch.nn.Module:
    """LoRA-wrap (default; adapter weights in fp32 whatever the base dtype) or unfreeze everything (fp32)."""
    model = lm.model
    model.train()
    if not cfg.lora:
        if next(model.parameters()).dtype != torch.float32:
            raise ValueError("full fine-tuning trains in fp32 (bf16 weights would round the updates away)")
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=0.0,
        target_modules=list(family(model).lora_targets),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lcfg, autocast_adapter_dtype=True)
    if cfg.init_adapter:
        load_adapter_weights(model, Path(cfg.init_adapter), cfg.rank)
    assert all(p.dtype == torch.float32 for p in _trainable(model).values())
    if cfg.side == "query" or cfg.objective == "distill":
        # The adapter is off unless a forward asks for it: the teacher and the frozen context are the base.
        query_adapter.register(lm.model)
    return model


OBJECTIVES = ("answer", "distill")
SIDES = ("both", "query")


def check_config(cfg: TrainConfig) -> None:
    """Refuse settings that do not go together, before any model is loaded."""
    if cfg.objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {cfg.objective!r}: use one of {', '.join(OBJECTIVES)}")
    if cfg.side not in SIDES:
        raise ValueError(f"unknown side {cfg.side!r}: use one of {', '.join(SIDES)}")
    if cfg.side == "query" and (not cfg.lora or cfg.causal):
        raise ValueError("a query-side adapter is a LoRA adapter trained on turbo: no --full, no --causal")
    if cfg.objective == "distill" and (cfg.causal or not cfg.lora):
        raise ValueError("distillation trains turbo against the base in full mode: LoRA, no --causal")


def load_adapter_weights(model, adapter: Path, rank: int) -> None:
    """Copy a saved LoRA adapter's weights into a freshly wrapped model, so a second training stage
    continues from the first (a stage on a corrected mix costs far fewer steps than a run from zero)."""
    from peft import set_peft_model_state_dict

    config = adapter / "adapter_config.json"
    if not config.is_file():
        raise ValueError(f"--init-adapter {adapter}: not a LoRA adapter folder (no adapter_config.json)")
    saved_rank = json.loads(config.read_text()).get("r")
    if saved_rank != rank:
        raise ValueError(
            f"--init-adapter {adapter} has LoRA rank {saved_rank}, not {rank}: pass --rank {saved_rank}"
        )
    result = set_peft_model_state_dict(model, load_file(str(adapter / "adapter_model.safetensors")))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing:
        raise ValueError(f"--init-adapter {adapter} lacks {len(missing)} LoRA weights, e.g. {missing[0]}")


def finetune(lm: LoadedModel, cfg: TrainConfig, progress: bool = True) -> Path:
    """Train, checkpointing as it goes; writes the final model folder to `cfg.out/model`."""
    check_config(cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    data = load_train_data(cfg.data)
    torch.manual_seed(cfg.seed)
    inv_freq = torch.stack(layer_inv_freq(lm.model))
    layout = PromptLayout(lm.tokenizer, cfg.template)
    model = prepare_model(lm, cfg)
    params = list(_trainable(model).values())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    start, losses = load_checkpoint(out, model, opt)
    if start:
        log.warning("resuming from step %d", start)
    teacher_of = _teachers(lm, layout, cfg, data)

    warmup = cfg.warmup

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay to 10%
        if step < warmup:
            return cfg.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, cfg.steps - warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    bar = progress_bar("finetune", total=cfg.steps, unit="step", enabled=progress, initial=start)
    t0 = time.perf_counter()
    for step in range(start, cfg.steps):
        t_step = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i in batch_for_step(len(data), step, cfg.batch, cfg.seed):
            loss, _ = example_loss(model, inv_freq, layout, data[i], cfg, teacher_of(i))
            (loss / cfg.batch).backward()
            total += loss.item() / cfg.batch
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        release_freed_memory()
        losses.append(round(total, 5))
        bar.set_postfix(loss=f"{total:.3f}", avg20=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        bar.update(1)
        _log_step(out, step + 1, total, lr_at(step), time.perf_counter() - t_step)
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(out, step + 1, model, opt, cfg, losses)
        if cfg.lora and cfg.keep_every and (step + 1) % cfg.keep_every == 0:
            save_adapter(model, cfg, out / "snapshots" / f"step-{step + 1}", step + 1)
    bar.close()
    log.info("trained %d steps in %.0f s", cfg.steps - start, time.perf_counter() - t0)
    return export(model, lm, cfg, out)


def _teachers(lm: LoadedModel, layout: PromptLayout, cfg: TrainConfig, data: list[dict]):
    """Example index -> its Teacher (objective "distill"; computed on first use and kept in the teacher
    file), or -> None for the answer objective."""
    if cfg.objective != "distill":
        return lambda i: None
    known = TeacherFile(Path(cfg.teacher) if cfg.teacher else Path(cfg.out) / "teacher.jsonl")
    stops = end_of_turn_ids(lm.tokenizer, lm.model)

    def teacher_of(i: int) -> Teacher:
        def compute() -> Teacher:
            ex, top_k = data[i], cfg.teacher_top_k
            return teach(lm.model, layout, stops, ex, cfg.teacher_tokens, top_k, cfg.max_passage_tokens)

        return known.get(i, compute)

    return teacher_of


def _log_step(out: Path, step: int, loss: float, lr: float, seconds: float) -> None:
    """One JSON line per step in out/log.jsonl: the loss curve, the seconds per step and the resident
    memory after it (GB, where /proc tells), kept on disk."""
    row = {"step": step, "loss": round(loss, 5), "lr": lr, "s": round(seconds, 3)}
    rss = resident_gb()
    if rss is not None:
        row["rss_gb"] = round(rss, 2)
    with open(out / "log.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def resident_gb() -> float | None:
    """This process's resident memory in GB (Linux /proc), else None."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e9


def release_freed_memory(above: float = 0.8) -> bool:
    """Hand memory freed by the last steps back to the OS (glibc's malloc_trim), once this process holds
    more than `above` of the machine's RAM; returns whether it trimmed.

    Every example has its own passage count and lengths, so each step frees activations of new sizes, and
    glibc keeps the freed pages in its arenas instead of returning them: an 800-question run grew from
    12 GB to 24 GB resident over 120 steps and was killed by the OOM killer on a 24 GB machine. Trimming
    after every step stopped that, but then every step faults its memory in again: on an AMD EPYC with
    AVX512-BF16 a bf16 step spent more than half its time in the kernel. So trim only when the pile-up
    nears the machine's limit: one step of 32 long passages holds about 17 GB, so at 0.7 of 24 GB it still
    trimmed every 3-5 steps. above=0 trims every time (the tests use it)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    if above > 0:
        rss, total = resident_gb(), _ram_gb()
        if rss is None or total is None or rss < above * total:
            return False
    trim(0)
    return True


@functools.cache
def _ram_gb() -> float | None:
    """The machine's physical memory in GB, or None where sysconf does not tell."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (OSError, ValueError):
        return None


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, looked up once (find_library runs ldconfig), or None where libc lacks it."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def save_adapter(model, cfg: TrainConfig, dest: Path, steps: int) -> None:
    """The LoRA adapter + turborag_finetune.json (which `--model` reads to find the base), atomically."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    meta = {**asdict(cfg), "steps_trained": steps, "cache_aware": not cfg.causal}
    (tmp / "turborag_finetune.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def export(model, lm: LoadedModel, cfg: TrainConfig, out: Path) -> Path:
    """Write `out/model`: an HF folder usable as `--model` everywhere (LoRA merged into the weights), plus
    the small LoRA adapter alone under `out/adapter` for shipping. The merge is made into fp32 base weights
    (reloaded when training ran on bf16 ones), as serving merges a shipped adapter."""
    dest = out / "model"
    if cfg.side == "query":
        # Never merged: merged weights would run the adapter over the context too. The adapter is the model.
        save_adapter(model, cfg, out / "adapter", cfg.steps)
        return out / "adapter"
    if cfg.lora:
        save_adapter(model, cfg, out / "adapter", cfg.steps)
        if lm.dtype != torch.float32:
            from peft import PeftModel

            from turborag.core.model import load_model

            base = load_model(cfg.model, str(lm.device), torch.float32).model
            model = PeftModel.from_pretrained(base, str(out / "adapter"))
        with query_adapter.active(model, True):  # a distilled adapter is off between forwards
            merged = model.merge_and_unload()
    else:
        merged = model
    merged.eval()
    merged.save_pretrained(dest)
    lm.tokenizer.save_pretrained(dest)
    (dest / "turborag_finetune.json").write_text(json.dumps(asdict(cfg), indent=1))
    return dest
