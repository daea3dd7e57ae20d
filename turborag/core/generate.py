"""Decode: pick tokens one at a time on top of a filled cache, streaming text as it comes.

A `DecodeState` is one request's decoding state; the forward that feeds its tokens is the caller's (one
sequence: `Engine.step`; many at once: `core/batch.py`), so the same picking, stopping and streaming serve
both.

Greedy by default; temperature / top-p / top-k sampling with an optional seed. Stops on any EOS id, on a
stop string (trimmed from the output), on a newline when `stop_at_newline` (short-answer QA), or after
`max_new_tokens`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_at_newline: bool = False
    # end-of-turn tokens and stop strings are ignored until this many tokens are generated (vLLM's
    # `min_tokens`): a benchmark uses it to measure decoding at a fixed answer length
    min_tokens: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ValueError("min_tokens must be in 0..max_new_tokens")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Next token id from last-position logits (vocab,)."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    logits = logits.float() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < params.top_p  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


class TextStream:
    """Incremental detokenisation with stop-string handling.

    Decodes the whole generated id list each step (tokens that merge into one character are then right)
    and holds back any tail that could still become a stop string.

    The text handed out is the answer with its surrounding whitespace removed, exactly what `Answer.text`
    holds: models often open with a space or a newline (a sentencepiece "▁150"), and a streamed answer must
    read the same as the whole one. Leading whitespace is dropped; whitespace after text is held back until
    more text follows it (one token later), so trailing whitespace is never handed out and there is nothing
    to take back at the end. `text` is always the concatenation of the deltas handed out so far.
    """

    def __init__(self, tokenizer, params: SamplingParams):
        self.tokenizer = tokenizer
        self.stops = list(params.stop) + (["\n"] if params.stop_at_newline else [])
        self.min_tokens = params.min_tokens
        self.free = 0  # characters decoded before min_tokens was reached
        self.ids: list[int] = []
        self.emitted = 0  # characters of the decoded text handed out (or, if leading whitespace, skipped)
        self.text = ""
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one token; return the newly safe text (may be empty)."""
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the next token
            return ""
        if len(self.ids) <= self.min_tokens:
            self.free = len(text)  # the first min_tokens tokens' text: no stop string counts in it
        stops = self.stops if len(self.ids) > self.min_tokens else []
        for s in stops:
            # a newline stops the answer only once the answer has started: leading newlines are skipped
            start = len(text) - len(text.lstrip()) if s == "\n" else max(0, self.emitted - len(s))
            start = max(start, self.free - len(s) + 1)  # a stop must end after the min_tokens text
            at = text.find(s, start)
            if at != -1:
                self.stopped = True
                text = text[:at]
                break
        safe = len(text)
        if not self.stopped:
            for s in stops:  # hold back a suffix that is a prefix of a stop string
                for n in range(min(len(s) - 1, len(text)), 0, -1):
                    if text.endswith(s[:n]):
                        safe = min(safe, len(text) - n)
                        break
        return self._hand_out(text, safe)

    def flush(self) -> str:
        """The rest of the answer once decoding has ended: what was held back for a stop string that never
        came (trailing whitespace stays dropped)."""
        if self.stopped:
            return ""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        return self._hand_out(text, len(text))

    def _hand_out(self, text: str, safe: int) -> str:
        """The delta of the answer within `text[:safe]`: from the first non-space character (or from where the
        last delta ended) up to the last non-space one."""
        begin = max(self.emitted, len(text) - len(text.lstrip()))
        end = len(text[:safe].rstrip())
        if end <= begin:
            return ""
        delta = text[begin:end]
        self.emitted = end
        self.text += delta
        return delta


class DecodeState:
    """One request being decoded: its cache, the logits of its last token, and what it has generated.

    The decoding loop is split so that a server can decode many sequences in one forward: `advance` picks
    the next token from `logits` and returns the text it releases (and the Answer once finished); a
    forward of `token` at position `pos` (one sequence alone: `Engine.step`; several: `DecodeBatch.step`)
    sets the next `logits`. `answer` is called with the finished sequence and builds the Answer.

    `cache` is the sequence's own cache after prefill; a DecodeBatch copies it into its buffers and drops it.
    `forced` tokens (the engine's threshold abstention) are emitted in order instead of picked; all but the
    last are fed to the model like picked ones, and the sequence ends with the last.
    """

    def __init__(
        self,
        tokenizer,
        stop_ids: set[int],
        params: SamplingParams,
        cache,
        logits: torch.Tensor,  # (vocab,) logits of the last prompt token
        next_pos: int,  # position of the first generated token
        t0: float,  # when the request started (TTFT is measured from here)
        answer: Callable[[DecodeState], object],
        prompt_tokens: int = 0,
        cached_tokens: int = 0,
        forced: list[int] | None = None,  # a reply decided before decoding: emitted instead of picked
        attention=None,  # core.ape.ApeContext of a turbo-ape sequence: its decode steps attend with APE
        adapter: bool = False,  # its tokens go through the model's query-side adapter (core/query_adapter.py)
    ):
        self.params = params
        self.stop_ids = stop_ids
        self.cache = cache
        self.logits = logits
        self.pos = next_pos
        self.t0 = t0
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self.stream = TextStream(tokenizer, params)
        self.generator = None
        if params.seed is not None:
            self.generator = torch.Generator(device=logits.device).manual_seed(params.seed)
        self.token: int | None = None  # the token to feed next (None until picked, or once finished)
        self.ttft: float | None = None
        self.finished = False
        self._answer = answer
        self._forced = list(forced) if forced else None
        self.attention = attention
        self.adapter = adapter

    @property
    def remaining(self) -> int:
        """Tokens this sequence may still feed to the model (cache room a batch must keep for it)."""
        return self.params.max_new_tokens - len(self.stream.ids)

    def advance(self) -> list:
        """Pick the next token: the text deltas it releases, then the Answer if the sequence has ended (EOS,
        a stop string, or max_new_tokens). Otherwise `token` is set, to be fed at `pos`."""
        logits = self.logits
        if len(self.stream.ids) < self.params.min_tokens and self.stop_ids:
            logits = logits.clone()
            logits[list(self.stop_ids)] = float("-inf")  # not the end yet: the best other token
        tok = self._forced.pop(0) if self._forced else pick(logits, self.params, self.generator)
        if self.ttft is None:
            self.ttft = time.perf_counter() - self.t0
        out: list = []
        self.token = None
        if tok not in self.stop_ids:
            delta = self.stream.push(tok)
            if delta:
                out.append(delta)
            forced_done = self._forced is not None and not self._forced
            if not (self.stream.stopped or forced_done or len(self.stream.ids) >= self.params.max_new_tokens):
                self.token = tok
                return out
        self.finished = True
        self.cache = None
        tail = self.stream.flush()
        if tail:
            out.append(tail)
        out.append(self._answer(self))
        return out

    def fed(self, logits: torch.Tensor) -> None:
        """`token` went through the model at `pos`; `logits` (vocab,) are its output."""
        self.logits = logits
        self.pos += 1
