"""`turborag bench decode`: tokens/s after the first token, at several concurrent sequences, against the
bound that memory bandwidth sets.

A decode step feeds one token per sequence. It reads every weight the forward uses once, whatever the
number of sequences, plus each sequence's cache: at one sequence it is memory-bound, and the most it can
reach is (memory bandwidth) / (bytes read per step). The bench measures that bandwidth on the machine
(`memory_bandwidth`, a read of a buffer far larger than the caches), counts the bytes
(`bytes_per_step`) and times the engine's own decode: `Engine.step` for one sequence (what `ask` runs),
`DecodeBatch.step` for several (what the server runs). Each sequence is a turbo answer to its own question
over the same passages; the prefill and the first token are not timed, and no sequence may stop early.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from turborag.bench.engine import QUESTION, doc_chunks
from turborag.core import decode_weights
from turborag.core.arch import kv_shape, layer_windows
from turborag.core.batch import DecodeBatch
from turborag.core.engine import Engine
from turborag.core.generate import DecodeState, SamplingParams


@dataclass
class DecodeRow:
    weights: str  # what decode steps read: "float" (the model's dtype), "int8" or "int4" (decode_weights.py)
    sequences: int
    steps: int  # decode steps timed, each one token per sequence
    seconds: float
    tokens_per_s: float  # every sequence's tokens together
    weight_bytes: int  # read once per step
    kv_bytes: int  # read per step, all sequences (the entries each layer can see)

    def summary(self) -> str:
        return (
            f"{self.weights:>5} {self.sequences:>3} sequences: {self.tokens_per_s:8.2f} tokens/s "
            f"({self.steps} steps, {self.seconds:.2f} s)"
        )


@dataclass
class Bandwidth:
    bytes_per_s: float
    buffer_bytes: int


def memory_bandwidth(buffer_bytes: int = 1 << 30, repeats: int = 5) -> Bandwidth:
    """Read bandwidth of this machine with torch's threads: the best of `repeats` sums over a buffer far
    larger than the CPU's caches (a sum reads each byte once and writes nothing)."""
    buf = torch.ones(buffer_bytes // 4, dtype=torch.float32)
    buf.sum()  # fault the pages in
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return Bandwidth(buffer_bytes / best, buffer_bytes)


def weight_bytes(model: torch.nn.Module, sequences: int = 1) -> int:
    """Bytes of the weights one decode step of `sequences` sequences reads: every parameter (a tied output
    layer counted once), less an untied input embedding, of which a step reads one row per sequence; a
    layer with a quantized copy that the step uses (decode_weights.py) counts the copy instead."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or head.weight is not emb.weight:
        total -= emb.weight.numel() * emb.weight.element_size()
    for m in model.modules():
        if isinstance(m, decode_weights.DecodeLinear) and sequences <= m.few_rows:
            total += decode_weights.copy_bytes(m) - m.weight.numel() * m.weight.element_size()
    return total


def kv_bytes(model: torch.nn.Module, entries: int, dtype: torch.dtype) -> int:
    """Bytes of K and V one sequence's decode step reads with `entries` cache entries (a sliding layer
    reads its window at most)."""
    _, kv_heads, head_dim = kv_shape(model)
    seen = sum(entries if w is None else min(entries, w) for w in layer_windows(model))
    return 2 * seen * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def question(i: int) -> str:
    """Sequence i's question: the same passages, a prompt of its own."""
    return f"{QUESTION} ({i + 1})"


def prompt_ids(engine: Engine, context_tokens: int) -> list[int]:
    """The token ids of the first sequence's whole prompt (what llama.cpp is given)."""
    return engine.layout.build(question(0), doc_chunks(engine, context_tokens)).ids


def _sequences(engine: Engine, n: int, chunks: list[str], steps: int) -> list[DecodeState]:
    """`n` turbo sequences over `chunks`, each asked its own question, their first token picked."""
    params = SamplingParams(max_new_tokens=steps + 1, min_tokens=steps + 1)  # EOS is never picked
    states = []
    for i in range(n):
        seq = engine.begin(question(i), chunks, "turbo", params)
        seq.advance()  # the first token: TTFT's, not decode's
        states.append(seq)
    return states


def _timed_steps(engine: Engine, states: list[DecodeState], steps: int) -> float:
    """Seconds for `steps` decode steps of every sequence, run as `ask` (one) or the server (several) does."""
    batch = DecodeBatch(engine.lm.model, engine.windows) if len(states) > 1 else None
    t0 = time.perf_counter()
    for _ in range(steps):
        if any(seq.finished for seq in states):  # min_tokens holds EOS back; nothing else may end one
            raise RuntimeError("a sequence ended before the bench's last step")
        if batch is None:
            engine.step(states[0])
        else:
            batch.step(states)
        for seq in states:
            seq.advance()
    return time.perf_counter() - t0


def bench_decode(
    engine: Engine,
    sequences: Sequence[int] = (1, 8, 32),
    steps: int = 32,
    context_tokens: int = 512,
    log: Callable[[str], None] = lambda line: None,
) -> list[DecodeRow]:
    """Decode tokens/s at each number of concurrent sequences, the same passages for all of them."""
    chunks = doc_chunks(engine, context_tokens)
    engine.precompute(chunks)
    _timed_steps(engine, _sequences(engine, 1, chunks, 2), 2)  # warm-up: first-call costs land nowhere
    rows = []
    for n in sequences:
        states = _sequences(engine, n, chunks, steps)
        entries = states[0].pos + steps // 2  # the cache's mean length over the timed steps
        seconds = _timed_steps(engine, states, steps)
        kv = n * kv_bytes(engine.lm.model, entries, engine.lm.dtype)
        weights = weight_bytes(engine.lm.model, n)
        rows.append(
            DecodeRow(engine.options.decode_weights, n, steps, seconds, n * steps / seconds, weights, kv)
        )
        log(rows[-1].summary())
    return rows


class LlamaCppUnavailable(RuntimeError):
    """llama-cpp-python is not installed (a benchmark-only extra)."""


def llama_cpp_decode(gguf: str, prompt_ids: list[int], steps: int, threads: int) -> float:
    """llama.cpp's decode of one sequence on the same GGUF and prompt, greedy, with `threads` threads:
    the prompt is prefilled and the first token picked untimed, then `steps` one-token steps are timed
    (seconds)."""
    try:
        from llama_cpp import Llama
    except ImportError as e:
        raise LlamaCppUnavailable(
            "llama-cpp-python is not installed: pip install 'turborag[llamacpp]' (it compiles llama.cpp "
            "for this CPU, a few minutes)"
        ) from e
    llm = Llama(
        model_path=str(gguf),
        n_ctx=len(prompt_ids) + steps + 16,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    tokens = llm.generate(prompt_ids, temp=0.0, reset=True)
    next(tokens)  # prefill and the first token
    t0 = time.perf_counter()
    for _ in range(steps):
        next(tokens)
    seconds = time.perf_counter() - t0
    tokens.close()
    return seconds
