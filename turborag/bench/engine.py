"""`turborag bench ttft`: full vs turbo time-to-first-token, measured alternately in one run.

The context is real text, CPython's own documentation (`pydoc_data.topics`, shipped with every Python),
split into chunks of `chunk_tokens` tokens. For each context size the chunks' caches are precomputed into
the store (timed separately, as precompute throughput), then full and turbo answer the same question in
alternation, `repeats` times each; the median is reported. Turbo's TTFT includes reading the chunk caches
from the store (disk, usually in the OS page cache) and assembling them. Before the first measurement each
mode answers once, untimed (`warm_up`), so that no mode's first-call costs land in the smallest size.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from turborag.core.engine import Engine
from turborag.core.generate import SamplingParams

QUESTION = "Which statement is used to handle exceptions in Python, and what clause runs no matter what?"
MEASURED_MODES = ("full", "turbo")


def doc_text() -> str:
    """CPython's topic documentation, in a stable order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def doc_chunks(engine: Engine, total_tokens: int, chunk_tokens: int = 512) -> list[str]:
    """Consecutive chunks of the docs whose chunk token counts add up to `total_tokens`."""
    tok = engine.lm.tokenizer
    ids = tok(doc_text(), add_special_tokens=False)["input_ids"]
    overhead = len(engine.layout.chunk_ids("x")) - len(tok("x", add_special_tokens=False)["input_ids"])
    if total_tokens > len(ids):
        raise ValueError(f"only {len(ids)} tokens of documentation available, asked for {total_tokens}")
    chunks, used, start = [], 0, 0
    while used < total_tokens:
        n = min(chunk_tokens, total_tokens - used) - overhead
        n = max(n, 1)
        text = tok.decode(ids[start : start + n])
        start += n
        chunks.append(text)
        used += len(engine.layout.chunk_ids(text))
    return chunks


def bench_context(
    model: str, dtype: str, context_tokens: int, chunk_tokens: int = 512
) -> tuple[Engine, list[str]]:
    """An engine on the CPU over the `bench ttft` store ($TURBORAG_HOME/bench-store) and the chunks of one
    context size, their caches computed if missing: where the scripts that take one request apart start."""
    from turborag.core.model import cache_format_for, load_model, turborag_home
    from turborag.store.kv_store import KVStore

    lm = load_model(model, "cpu", dtype)
    engine = Engine(lm, KVStore(turborag_home() / "bench-store", cache_format_for(lm.dtype)))
    chunks = doc_chunks(engine, context_tokens, chunk_tokens)
    engine.precompute(chunks)
    return engine, chunks


@dataclass
class TTFTRow:
    context_tokens: int
    chunks: int
    full_ttft_s: float
    turbo_ttft_s: float
    floor_ttft_s: float  # question prefill + first token against the same context already assembled
    speedup: float
    precompute_tok_s: float  # chunk tokens precomputed per second (batched, behind the prefix)
    full_prefill_tok_s: float  # prompt tokens per second of a full prefill (its TTFT)
    cache_bytes_per_token: float  # on disk, including the safetensors header

    def summary(self) -> str:
        """The progress line a run prints as each size is done (the table or JSON comes at the end)."""
        return (
            f"{self.context_tokens} context tokens: full {self.full_ttft_s:.3f} s, turbo "
            f"{self.turbo_ttft_s:.3f} s ({self.speedup:.1f}x), floor {self.floor_ttft_s:.3f} s"
        )


def bench_ttft(
    engine: Engine,
    sizes: Sequence[int],
    repeats: int = 3,
    chunk_tokens: int = 512,
    log=print,
    samples: int = 5,
) -> list[TTFTRow]:
    """Full, turbo and floor TTFT per context size, each its mode's median; `log` gets one progress line (a
    str) per size.

    Full prefill is measured `repeats` times. Turbo and the floor are measured `samples` times per repeat, in
    turbo-then-floor pairs: each takes a tenth of a second against seconds to minutes for a full prefill,
    and with one request each per repeat, turbo / floor at 8k context tokens moved by 10-20 points from run
    to run (turborag_research/notes/2026-12-06-ttft-floor.md) as the machine's speed drifted between the two.
    Within a repeat,
    full goes first or last by turns."""
    rows = []
    one = SamplingParams(max_new_tokens=1)
    engine.answer("warm up", ["A short warm-up passage."], "full", one)  # before precompute is timed
    for size in sizes:
        chunks = doc_chunks(engine, size, chunk_tokens)
        # Fresh caches for this size: precompute throughput is measured on chunks not yet stored.
        for c in chunks:
            engine.store.delete(engine.key(engine.layout.chunk_ids(c)))
        t = time.perf_counter()
        _, tokens = engine.precompute(chunks)
        pre_s = time.perf_counter() - t
        nbytes = sum(engine.store.size(engine.key(engine.layout.chunk_ids(c))) or 0 for c in chunks)
        if not rows:
            warm_up(engine, chunks, one)

        full, turbo, floor = [], [], []
        for r in range(repeats):
            if r % 2 == 0:
                full.append(_timed(engine, chunks, "full", one))
            for _ in range(samples):
                turbo.append(_timed(engine, chunks, "turbo", one))
                floor.append(floor_ttft(engine, QUESTION, chunks))
            if r % 2 == 1:
                full.append(_timed(engine, chunks, "full", one))
        f, tb, fl = statistics.median(full), statistics.median(turbo), statistics.median(floor)
        ctx = sum(len(engine.layout.chunk_ids(c)) for c in chunks)
        prompt_tokens = ctx + len(engine.prefix_ids) + len(engine.layout.suffix_ids(QUESTION))
        row = TTFTRow(ctx, len(chunks), f, tb, fl, f / tb, tokens / pre_s, prompt_tokens / f, nbytes / ctx)
        log(row.summary())
        rows.append(row)
    return rows


def _timed(engine: Engine, chunks: list[str], mode: str, params: SamplingParams) -> float:
    """The TTFT of one answer to the bench's question; every chunk cache must come from the store."""
    a = engine.answer(QUESTION, chunks, mode, params)
    if a.computed_chunks:
        raise RuntimeError("a chunk cache was missing at query time; the bench would be unfair")
    return a.ttft_s


def warm_up(engine: Engine, chunks: list[str], params: SamplingParams) -> None:
    """One untimed answer per measured mode, and one floor, on the first size's context.

    The first call down each path pays one-time costs (kernel selection, allocator growth, the first reads of
    the store's files); measured, they made the smallest size the slowest with `--repeats 1` (1.85 s at 512
    tokens), and a plot showed TTFT falling as the context grew.
    """
    for mode in MEASURED_MODES:
        engine.answer(QUESTION, chunks, mode, params)
    floor_ttft(engine, QUESTION, chunks)


def floor_ttft(engine: Engine, question: str, passages: Sequence[str]) -> float:
    """What turbo's TTFT would be if loading and assembling were free: the context is assembled (untimed,
    exactly as turbo assembles it), then the question is prefilled and the first token picked (timed). With
    an abstention threshold (the shipped adapter has one) the reply is scored in the same forward and its
    log-probability read off, as turbo does before its first token: that is model work, not loading (`bench
    abstain` measures what it costs)."""
    prompt = engine.layout.build(question, list(passages))
    reserve = len(prompt.suffix) + len(engine.scored_reply) + 8
    ctx = engine.assemble(prompt, "turbo", reserve)
    cache, next_pos = ctx.cache, ctx.next_pos
    t = time.perf_counter()
    logits = engine.prefill_question(cache, prompt, next_pos, scored=True)
    int(logits.argmax())  # the first token, as greedy decoding picks it (and a device sync)
    return time.perf_counter() - t


@dataclass
class AbstainCostRow:
    context_tokens: int
    turbo_ttft_s: float  # greedy decoding alone
    scored_ttft_s: float  # the abstention reply scored in the same prefill forward
    overhead: float  # scored / plain

    def summary(self) -> str:
        """The progress line a run prints as each size is done."""
        return (
            f"{self.context_tokens} context tokens: turbo {self.turbo_ttft_s:.3f} s, with the abstention "
            f"reply scored {self.scored_ttft_s:.3f} s ({self.overhead:.2f}x)"
        )


def bench_abstain_cost(
    engine: Engine, sizes: Sequence[int], repeats: int = 5, chunk_tokens: int = 512, log=print
) -> list[AbstainCostRow]:
    """Turbo TTFT with and without scoring the abstention reply (the abstention threshold), alternating.
    The scored runs use threshold 1, which no probability reaches, so both answer the same; the cost of
    scoring does not depend on the threshold. Threshold 0 is none: greedy decoding alone."""
    one = SamplingParams(max_new_tokens=1)
    without, scoring = engine.with_options(abstain_threshold=0), engine.with_options(abstain_threshold=1.0)
    rows = []
    engine.answer("warm up", ["A short warm-up passage."], "turbo", one)
    for size in sizes:
        chunks = doc_chunks(engine, size, chunk_tokens)
        engine.precompute(chunks)
        plain, scored = [], []
        for r in range(repeats):
            order = (
                ((without, plain), (scoring, scored)) if r % 2 == 0 else ((scoring, scored), (without, plain))
            )
            for arm, acc in order:
                acc.append(arm.answer(QUESTION, chunks, "turbo", one).ttft_s)
        ctx = sum(len(engine.layout.chunk_ids(c)) for c in chunks)
        a, b = statistics.median(plain), statistics.median(scored)
        row = AbstainCostRow(ctx, a, b, b / a)
        log(row.summary())
        rows.append(row)
    return rows


def rows_as_dicts(rows: Sequence) -> list[dict]:
    return [asdict(r) for r in rows]


def bench_precompute(
    engine: Engine, batch_sizes: Sequence[int], n_chunks: int = 16, chunk_tokens: int = 256, rounds: int = 2
) -> list[dict]:
    """Precompute throughput (chunk tokens/s) per batch size, rounds alternating between sizes.

    Chunks are computed with `kv.precompute_chunks` directly (nothing stored), so only the forward is timed.
    """
    from turborag.core import kv

    chunks = [engine.layout.chunk_ids(c) for c in doc_chunks(engine, n_chunks * chunk_tokens, chunk_tokens)]
    tokens = sum(len(c) for c in chunks)
    kv.precompute_chunks(engine.lm.model, engine.prefix_kv, chunks[:2], batch_size=2)  # warm-up
    times: dict[int, list[float]] = {b: [] for b in batch_sizes}
    for _ in range(rounds):
        for b in batch_sizes:
            t = time.perf_counter()
            kv.precompute_chunks(
                engine.lm.model, engine.prefix_kv, chunks, batch_size=b, pad_id=engine.pad_id
            )
            times[b].append(time.perf_counter() - t)
    return [
        {"batch_size": b, "tokens": tokens, "tok_s": tokens / statistics.median(ts)}
        for b, ts in times.items()
    ]
