"""One request, start to finish: prompt -> (cached or full) prefill -> first token -> stream.

Modes, all in this one engine so that the only difference between them is cache reuse:
- `full`: standard RAG. The whole prompt (prefix + passages + question) is prefilled at query time.
- `turbo`: the passages' precomputed caches are loaded from the store, re-positioned to contiguous
  (reordered) positions, placed after the prefix cache, and only the question suffix is prefilled.
- `turbo-composite`: the same with composite positions (every chunk keeps its own offsets).
- `turbo-epic` / `turbo-blend`: turbo plus a training-free recompute of a few context tokens
  (`recompute.py`): the first k tokens of each chunk, or the `ratio` most-deviating tokens.
- `turbo-ape`: turbo with APE's attention temperature and scaling for every token after the context
  (`ape.py`); `turbo-ape-epic` adds the epic recompute under it.

TTFT is measured from the call until the first generated token id is known. It includes tokenizing the
prompt and, in turbo modes, reading the chunk caches from the store and assembling them. Precomputing the
caches is offline work (ingest) and is not included; a cache missing at query time is computed on the spot
and that time *is* included (and reported as `computed_chunks`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from turborag.core import ape, decode_weights, grounding, hf_compat, kv, modes, query_adapter, recompute
from turborag.core.arch import end_of_turn_ids, kv_shape, layer_inv_freq, layer_windows
from turborag.core.defaults import (
    CALIBRATION_FEW_RIGHT,
    CALIBRATION_SLOWER,
    CALIBRATION_WITHIN,
    UNTUNED_MODE,
    turborag_home,
)
from turborag.core.feeds import Feed
from turborag.core.generate import DecodeState, SamplingParams
from turborag.core.model import LoadedModel
from turborag.core.modes import check_mode
from turborag.core.options import TRAINING_FREE_DEFAULTS, EngineOptions, TrainingFree
from turborag.core.prefix_cache import PrefixCache
from turborag.core.prompt import Prompt, PromptLayout, abstain_ids
from turborag.store.chunk_kv import ChunkKV
from turborag.store.codec import Damaged, tensor_bytes
from turborag.store.errors import StoreUnavailable
from turborag.store.kv_store import KVStore, cache_key
from turborag.store.tiered import TieredStore
from turborag.store.write_quota import WriteBudget

log = logging.getLogger(__name__)


class PromptTooLong(ValueError):
    """The prompt plus the answer budget does not fit the model's context window."""


@dataclass
class Answer:
    text: str
    mode: str
    ttft_s: float
    total_s: float
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from precomputed caches (prefix + chunks)
    completion_tokens: int
    computed_chunks: int = 0  # chunks whose cache was missing and computed inside this request
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = "stop"  # "stop" (EOS or stop string) or "length" (max_new_tokens reached)
    abstain_logprob: float | None = None  # log p(ABSTAIN | prompt), scored when a threshold is set
    missing_names: list[str] = field(default_factory=list)  # why the name check declined (grounding.py)


@dataclass
class Assembled:
    """A turbo context ready for the question: the prefix and chunk caches placed in one cache."""

    cache: hf_compat.DynamicCache
    next_pos: int  # the position of the question's first token
    cached: int  # prompt tokens served from caches (prefix + chunks, less any recomputed)
    computed: int  # chunks whose cache was missing and computed inside this request


@dataclass
class Prefilled:
    """A prompt after its prefill: what decoding starts from, and what the Answer reports about it."""

    cache: hf_compat.DynamicCache
    logits: torch.Tensor  # (1 + scored reply tokens, vocab): the prompt's last token's first
    next_pos: int  # the position of the first generated token
    cached: int  # prompt tokens served from caches
    computed: int  # chunks computed inside this request
    attention: ape.ApeContext | None = None  # APE's context, for a sequence answering in turbo-ape
    adapter: bool = False  # decodes through the query-side adapter (query_adapter.py)


@dataclass
class Decision:
    """What was decided before the first token: a reply forced instead of decoded, and why."""

    forced: list[int] | None = None  # the abstention reply, emitted as it is
    logp: float | None = None  # log p(abstention reply), when a threshold is set
    missing: list[str] = field(default_factory=list)  # names the question has and no passage (grounding.py)


def drain(steps: Generator):
    """Run a step generator (begin_steps, _feed_steps) to its end, each deferred Feed alone; its return
    value."""
    sent = None
    while True:
        try:
            step = steps.send(sent)
        except StopIteration as done:
            return done.value
        sent = step.run() if isinstance(step, Feed) else None


def reply_logprob(logits: torch.Tensor, reply: list[int]) -> float:
    """log p(reply | prompt) from `logits` (len(reply), vocab): those of the prompt's last token, then of
    each reply token but the last, fed after it (teacher forcing).

    Why the engine scores its abstention reply this way: greedy decoding abstains only when the reply's
    tokens win one by one, yet the probability the shipped fine-tune gives the whole reply tells questions
    whose answering passage is missing from answerable ones better (ROC AUC 0.98 on held-out twins,
    turborag_research/notes/2026-12-01-abstention-threshold.md), so a threshold below one half catches more
    of them. The reply rides in the same
    forward as the prompt (about 6 more tokens), so scoring costs no extra pass over the weights.
    """
    logp = logits.float().log_softmax(-1)  # (R, vocab)
    target = torch.tensor(reply, device=logits.device)[:, None]  # (R, 1)
    return logp.gather(1, target).sum().item()


def calibration_warnings(record: dict) -> list[str]:
    """Each way a calibrated mode falls short of the bar (core/defaults.py), from the record's own numbers
    (eval/calibrate.py): more than 3 points below full, a TTFT above 1.5x plain turbo's, too few questions
    that full answered."""
    n = record.get("n", 0)
    acc, full = record.get("accuracy", 0), record.get("full_accuracy", 0)
    out = []
    if full - acc > CALIBRATION_WITHIN:
        out.append(
            f"on its {n} calibration questions it is {full - acc:.0%} below full ({acc:.0%} vs {full:.0%}):"
            " use --mode full where accuracy matters more than time to first token"
        )
    ttft, turbo = record.get("ttft_s_p50"), record.get("turbo_ttft_s_p50")
    if ttft and turbo and ttft > CALIBRATION_SLOWER * turbo:
        out.append(f"its time to first token there was {ttft / turbo:.1f}x plain turbo's")
    if round(full * n) < CALIBRATION_FEW_RIGHT:
        out.append(
            f"full answered only {round(full * n)} of the {n} calibration questions, too few to compare "
            "modes on: calibrate again on more of your questions (30-100 that full answers)"
        )
    return out


class Engine:
    """Holds the model, its prompt layout, the prefix cache and the chunk store."""

    def __init__(self, lm: LoadedModel, store: KVStore, options: EngineOptions | None = None):
        options = options or EngineOptions()
        kind = decode_weights.kind_of(lm.model)
        if options.decode_weights != "float":
            # copies beside the weights, kept on disk under the model's fingerprint
            kept = f"{lm.fingerprint}-{options.decode_weights}.safetensors"
            decode_weights.use_decode_weights(
                lm.model, options.decode_weights, turborag_home() / "decode-weights" / kept
            )
        elif kind != "float":
            raise ValueError(
                f"this model decodes with {kind} weights (decode_weights={kind!r}): load it again"
            )
        self.lm = lm
        self.options = options
        self.layout = PromptLayout(lm.tokenizer, options.template)
        self.inv_freq = torch.stack(layer_inv_freq(lm.model))  # (layers, head_dim/2) fp64
        self.windows = layer_windows(lm.model)  # per layer: sliding window, or None for global layers
        self.stop_ids = end_of_turn_ids(lm.tokenizer, lm.model)
        self.prefix_ids = self.layout.prefix_ids()
        self.prefix_kv = kv.prefill_prefix(lm.model, self.prefix_ids)  # resident: shared by every request
        # A query-side adapter reads the turbo modes' question and answer tokens; the context is the base's.
        self.query_adapter = query_adapter.attached(lm.model)
        pad = lm.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else 0
        # The reply as this model would write it: after "Answer:" or from a fine-tune's targets, with a space.
        spaced = lm.answer_trained or self.layout.template == "plain"
        self.abstain_ids = abstain_ids(lm.tokenizer, spaced)
        self.prefix_cache = PrefixCache(
            block_size=options.prefix_block, max_tokens=options.prefix_cache_tokens, salt=lm.fingerprint
        )
        # The chunk caches: a RAM tier of decoded layers in front of the store (store/tiered.py).
        self.caches = TieredStore(store, options.ram_cache_bytes, lm.device, lm.dtype)
        # Store keys by chunk token ids: hashing the JSON of 8k tokens costs 0.5 ms a turbo request at 8k,
        # and a server is asked about the same chunks again and again. 1024 chunks of 512 tokens hold about
        # 20 MB of ids (a tuple's pointers and int objects); a key not held costs 30 us to hash again.
        self._keys = functools.lru_cache(maxsize=1024)(self._key_of)
        self.isolate_collections = options.isolate_collections
        self._resolve(options)

    def _resolve(self, options: EngineOptions) -> None:
        """The answering settings: as `options` give them, else as the model records them (the fine-tune's
        threshold and name check, `turborag calibrate`'s choice), else the defaults."""
        self.batch_size = options.batch_size
        # Tokens a prefill forward takes at most (begin_steps); None: the whole prompt in one forward, the
        # fastest for a request alone (the server passes its own step, DEFAULT_PREFILL_STEP).
        self.prefill_step = options.prefill_step
        chosen = (self.lm.calibration or {}).get("settings", {})
        self.training_free = TrainingFree(
            **{
                name: given if (given := getattr(options, name)) is not None else chosen.get(name, default)
                for name, default in TRAINING_FREE_DEFAULTS.items()
            }
        )
        # Abstain when the model gives the abstention reply at least this probability (None: only when
        # greedy decoding picks it). `reply_logprob` explains why.
        given = options.abstain_threshold
        self.abstain_threshold = self.lm.abstain_threshold if given is None else (given or None)
        # Decline, without asking the model, a question that names something no passage mentions.
        self.name_check = self.lm.name_check if options.name_check is None else options.name_check

    def with_options(self, **changes) -> Engine:
        """This engine answering with some options changed (a calibration's candidate, a benchmark's other
        arm): the model, the caches and the prefix cache are shared, so it costs nothing to make. Only the
        answering settings can change; the template, the RAM tier, the prefix cache and the decode weights
        (a change to the shared model) are the engine's."""
        fixed = {"template", "ram_cache_bytes", "prefix_block", "prefix_cache_tokens", "decode_weights"}
        fixed &= set(changes)
        if fixed:
            raise ValueError(f"{', '.join(sorted(fixed))}: build another Engine for that")
        other = copy.copy(self)
        other.options = dataclasses.replace(self.options, **changes)
        other._resolve(other.options)
        return other

    # -- modes ---------------------------------------------------------------------------------------------

    def resolve_mode(self, mode: str) -> str:
        """`auto` -> turbo on a cache-aware fine-tune, else the mode `turborag calibrate` chose for this
        model, else the training-free mode that measured best on models nobody tuned (UNTUNED_MODE)."""
        check_mode(mode)
        if mode != "auto":
            return mode
        if self.lm.cache_aware:
            return "turbo"
        if self.lm.calibration:
            return check_mode(self.lm.calibration["mode"])
        return UNTUNED_MODE

    def auto_notice(self) -> str | None:
        """The one line to show a user whose `auto` does not mean plain turbo (None when it does)."""
        if self.lm.cache_aware:
            return None
        record = self.lm.calibration
        if record:
            line = f"{self.lm.name}: `auto` answers in {record['mode']}, as `turborag calibrate` chose"
            return "; ".join([line, *calibration_warnings(record)])
        return (
            f"{self.lm.name} has no cache-aware fine-tune, so `auto` answers in {UNTUNED_MODE} (recomputes "
            "about 15% of the passage tokens); `turborag calibrate` picks the best training-free mode on "
            "your own questions, `turborag finetune` would make plain turbo safe on it"
        )

    @property
    def store(self) -> KVStore:
        """The persistent store under the RAM tier (files, Redis), as ingest and the cache commands use it."""
        return self.caches.store

    # -- keys and precompute -------------------------------------------------------------------------

    def key(self, chunk_ids: Sequence[int], collection: str | None = None) -> str:
        """The store key of a chunk: its token ids behind this engine's prefix, model and cache format; with
        isolated collections, also the collection's name (a ValueError without one)."""
        scope = ""
        if self.isolate_collections:
            if not collection:
                raise ValueError("this store keys its caches per collection: name the collection")
            scope = collection
        return self._keys(tuple(chunk_ids), scope)

    def _key_of(self, chunk_ids: tuple[int, ...], scope: str) -> str:
        fmt = self.store.cache_format
        return cache_key(self.lm.fingerprint, self.prefix_ids, list(chunk_ids), fmt, scope)

    def precompute(
        self, passages: Sequence[str], on_batch=None, collection: str | None = None
    ) -> tuple[int, int]:
        """Compute and store the caches of passages not stored yet. Returns (chunks, tokens) computed.
        `on_batch(n_tokens)` after each forward batch (a progress bar's update)."""
        chunks = {self.key(ids, collection): ids for ids in map(self.layout.chunk_ids, passages)}
        report = (lambda _n, tokens: on_batch(tokens)) if on_batch else None
        return self.precompute_ids(chunks, report)

    @property
    def precompute_group(self) -> int:
        """Chunks sorted by length together, so that each forward batch pads little; every batch is stored
        as it ends (a crash loses at most one), and ingest commits its documents once per group."""
        return self.batch_size * 8

    def precompute_ids(
        self, chunks: dict[str, list[int]], on_batch: Callable[[int, int], None] | None = None
    ) -> tuple[int, int]:
        """`precompute` for chunks already tokenized and keyed ({key: chunk token ids}, as ingest has them):
        computes and stores those not stored yet, `on_batch(n_chunks, n_tokens)` after each forward batch.
        Returns (chunks, tokens) computed."""
        todo = {k: ids for k, ids in chunks.items() if k not in self.store}
        self._compute_and_store(todo, on_batch)
        return len(todo), sum(len(v) for v in todo.values())

    def _compute_and_store(
        self, todo: dict[str, list[int]], on_batch=None, keep: bool = False, persist: bool = True
    ) -> dict[str, ChunkKV]:
        """Compute and store caches (without `persist`: hold them in the RAM tier only); with `keep`, also
        return them (in the store's dtype, exactly as they would be read back), otherwise nothing is held in
        memory beyond one group.

        With `keep` (a request computing what it did not find) a store that cannot be reached only costs the
        write: the answer still uses the caches. Without it (ingest) the error is the caller's to report.
        Chunks computed here are also kept in the RAM tier (write-through), ready in the compute dtype."""
        keys = list(todo)
        out = {}
        unreachable = False
        for s in range(0, len(keys), self.precompute_group):
            part = keys[s : s + self.precompute_group]

            def put(i: int, c: ChunkKV, part: list[str] = part) -> None:
                """Store one chunk's cache as its forward batch ends: a crash loses at most that batch."""
                nonlocal unreachable
                k = part[i]
                try:
                    if persist and not unreachable:
                        self.store.put(k, c)
                except StoreUnavailable as e:
                    if not keep:
                        raise
                    log.warning("%s; this answer uses the caches it computed without storing them", e)
                    unreachable = True
                stored = self.caches.hold(k, c, keep)
                if keep:
                    out[k] = stored

            kv.precompute_chunks(
                self.lm.model,
                self.prefix_kv,
                [todo[k] for k in part],
                self.batch_size,
                self.pad_id,
                on_batch=on_batch,
                on_chunk=put,
            )
        return out

    # -- answering -----------------------------------------------------------------------------------

    def check_length(self, prompt_tokens: int, max_new_tokens: int) -> None:
        limit = self.lm.max_positions
        if prompt_tokens + max_new_tokens > limit:
            raise PromptTooLong(
                f"prompt of {prompt_tokens} tokens + {max_new_tokens} new tokens exceeds the model's "
                f"context window of {limit} tokens"
            )

    def check_fits(self, question: str, passages: Sequence[str], params: SamplingParams) -> Prompt:
        """The prompt of `question` over `passages`, or PromptTooLong when it and the answer (or the
        abstention reply the threshold feeds) do not fit the context window. A server calls it before it
        queues a request, so that one which can never run is refused at once."""
        prompt = self.layout.build(question, list(passages))
        self.check_length(len(prompt.ids), max(params.max_new_tokens, len(self.scored_reply)))
        return prompt

    @property
    def scored_reply(self) -> list[int]:
        """The tokens fed after the prompt, in its forward, to score the abstention reply: all of the reply
        but its last token when there is a threshold (reply_logprob), none without one."""
        return self.abstain_ids[:-1] if self.abstain_threshold is not None else []

    def qa_params(self, max_new_tokens: int = 64) -> SamplingParams:
        """The defaults for answering a question from passages. A base model (plain template) does not stop
        after its answer: it runs on into a made-up "Question: ..." line, so it stops at the end of the line;
        a chat model stops at its end-of-turn token."""
        return SamplingParams(max_new_tokens=max_new_tokens, stop_at_newline=self.layout.template == "plain")

    def answer(
        self,
        question: str,
        passages: Sequence[str],
        mode: str = "auto",
        params: SamplingParams | None = None,
    ):
        """Run to completion; returns the Answer. `params` default to `qa_params()`."""
        result = None
        for item in self.stream(question, passages, mode, params):
            if isinstance(item, Answer):
                result = item
        return result

    def stream(
        self,
        question: str,
        passages: Sequence[str],
        mode: str = "auto",
        params: SamplingParams | None = None,
        collection: str | None = None,
    ) -> Iterator[str | Answer]:
        """Yield text deltas as they are decoded, then the final Answer (its `mode` is the one used: `auto`
        resolved). `params` default to `qa_params()`."""
        yield from self.run(self.begin(question, passages, mode, params, collection))

    def begin(
        self,
        question: str,
        passages: Sequence[str],
        mode: str = "auto",
        params: SamplingParams | None = None,
        collection: str | None = None,
    ) -> DecodeState:
        """Everything up to the first token: the prompt built, the context prefilled (full) or assembled from
        chunk caches with only the question prefilled (turbo modes). Returns the sequence to decode."""
        return drain(self.begin_steps(question, passages, mode, params, collection=collection))

    def begin_steps(
        self,
        question: str,
        passages: Sequence[str],
        mode: str = "auto",
        params: SamplingParams | None = None,
        step: int | None = None,
        defer: bool = False,
        persist: bool | WriteBudget = True,
        collection: str | None = None,
    ) -> Generator[int | Feed, torch.Tensor | None, DecodeState]:
        """`begin` one forward at a time: yields the tokens of each prefill forward (at most `step`, else
        `prefill_step`, a forward) and returns the sequence, so that a server can decode other requests, or
        drop a cancelled one, between the forwards of a long prefill (a prefill in steps).

        With `defer`, each forward is yielded as a `Feed` instead of run, and its logits are sent back
        (`steps.send(logits)`): a server then runs the feeds of several requests in one forward
        (core/feeds.py). Without `persist`, a chunk cache the store lacks is computed for this request and
        held in RAM only (the RAM tier's budget), never written to the store: a caller who may not write
        (a read-only key's own passages) cannot grow it. `collection` names whose caches these are, for a
        store that isolates collections (Engine.key)."""
        mode = self.resolve_mode(mode)
        params = params or self.qa_params()
        t0 = time.perf_counter()
        prompt = self.check_fits(question, passages, params)
        extra = self.scored_reply
        reserve = params.max_new_tokens + 8  # decode room in the cache buffers
        # With a threshold, the abstention reply (less its last token) is fed right after the prompt in the
        # same forward, its probability read off, and cut back out of the cache (reply_logprob).
        if mode == "full":
            done = yield from self._prefill_full(prompt, reserve, extra, step, defer)
        else:
            done = yield from self._prefill_turbo(
                prompt, mode, reserve + len(prompt.suffix), extra, step, defer, persist, collection
            )
        decision = Decision()
        if self.abstain_threshold is not None:
            for layer in done.cache.layers:
                layer.crop(len(extra))  # the prompt's cache again
            decision.logp = reply_logprob(done.logits, self.abstain_ids)
            if decision.logp >= math.log(self.abstain_threshold):
                decision.forced = self.abstain_ids
        # The prefill above still runs on a declined question: its TTFT and token counts stay comparable.
        decision.missing = grounding.missing_names(question, passages) if self.name_check else []
        if decision.missing:
            decision.forced = self.abstain_ids
        if decision.forced and params.min_tokens > len(decision.forced):
            # the caller asked for an answer longer than the fixed reply: the model answers
            decision.forced, decision.missing = None, []
        return self._sequence(done, params, t0, mode, len(prompt.ids), decision)

    def complete_stream(
        self, prompt_ids: list[int], params: SamplingParams | None = None
    ) -> Iterator[str | Answer]:
        """A plain prompt (no retrieval), reusing the longest previously seen prefix (prefix_cache.py)."""
        yield from self.run(self.begin_prompt(prompt_ids, params))

    def begin_prompt(
        self, prompt_ids: list[int], params: SamplingParams | None = None, partition: str = ""
    ) -> DecodeState:
        """`begin` for a plain prompt: only the part after its longest cached prefix is prefilled. The prefix
        cache is looked up and filled in `partition` only (a server's: the API key's, prefix_cache.py)."""
        return drain(self.begin_prompt_steps(prompt_ids, params, partition))

    def begin_prompt_steps(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        partition: str = "",
        step: int | None = None,
        defer: bool = False,
    ) -> Generator[int | Feed, torch.Tensor | None, DecodeState]:
        """`begin_prompt` one prefill forward at a time, as `begin_steps` (`defer` too)."""
        params = params or SamplingParams()
        t0 = time.perf_counter()
        if not prompt_ids:
            raise ValueError("empty prompt")
        self.check_length(len(prompt_ids), params.max_new_tokens)
        dev, dtype = self.lm.device, self.lm.dtype
        reserve = len(prompt_ids) + params.max_new_tokens + 8
        n, hit = self.prefix_cache.match(prompt_ids[:-1], partition)  # keep >= 1 token to prefill (logits)
        if hit is not None:
            cache, _ = kv.assemble_into(hit, [], self.inv_freq, "reordered", dev, dtype, reserve)
        else:
            cache = hf_compat.buffered_cache(self.lm.config.num_hidden_layers, reserve=reserve)
        logits = yield from self._feed_steps(cache, prompt_ids[n:], n, 1, step=step, defer=defer)  # (1, V)
        self.prefix_cache.insert(prompt_ids, hf_compat.cache_layers(cache), partition)
        n_ids = len(prompt_ids)
        return self._sequence(Prefilled(cache, logits[-1:], n_ids, n, 0), params, t0, "prompt", n_ids)

    def run(self, seq: DecodeState) -> Iterator[str | Answer]:
        """Decode one sequence alone: yield text deltas, then the Answer (TTFT = first token known)."""
        while True:
            yield from seq.advance()
            if seq.finished:
                return
            self.step(seq)

    @torch.inference_mode()
    def step(self, seq: DecodeState) -> None:
        """Feed one sequence's picked token through the model, on its own cache."""
        ids = torch.tensor([[seq.token]], device=self.lm.device)  # (1, 1)
        pos = torch.tensor([[seq.pos]], device=self.lm.device)  # (1, 1)
        with (
            self._attention(seq.attention) as kwargs,
            query_adapter.active(self.lm.model, seq.adapter),
            decode_weights.decoding(),
        ):
            seq.fed(hf_compat.forward(self.lm.model, ids, pos, seq.cache, logits_to_keep=1, **kwargs)[0, -1])

    @contextlib.contextmanager
    def _attention(self, attention: ape.ApeContext | None):
        """The forward's extra keywords: none for plain attention; APE's context (and the model switched to
        APE's attention function) for a sequence answering in turbo-ape."""
        if attention is None:
            yield {}
            return
        with ape.enabled(self.lm.model):
            yield {"ape": attention}

    def _sequence(
        self,
        done: Prefilled,
        params: SamplingParams,
        t0: float,
        mode: str,
        prompt_tokens: int,
        decision: Decision | None = None,
    ) -> DecodeState:
        """The decoding state after prefill; its Answer records the mode and the prompt's token counts."""
        decision = decision or Decision()

        def answer(seq: DecodeState) -> Answer:
            total = time.perf_counter() - t0
            stream = seq.stream
            length_cut = len(stream.ids) >= params.max_new_tokens and not stream.stopped
            return Answer(
                text=stream.text.strip(),
                mode=mode,
                ttft_s=seq.ttft if seq.ttft is not None else total,
                total_s=total,
                prompt_tokens=prompt_tokens,
                cached_tokens=done.cached,
                completion_tokens=len(stream.ids),
                computed_chunks=done.computed,
                token_ids=list(stream.ids),
                finish_reason="length" if length_cut else "stop",
                abstain_logprob=decision.logp,
                missing_names=list(decision.missing),
            )

        return DecodeState(
            self.lm.tokenizer,
            self.stop_ids,
            params,
            done.cache,
            done.logits[0],
            done.next_pos,
            t0,
            answer,
            prompt_tokens=prompt_tokens,
            cached_tokens=done.cached,
            forced=decision.forced,
            attention=done.attention,
            adapter=done.adapter,
        )

    def _prefill_full(
        self, prompt: Prompt, reserve: int, extra: list[int], step: int | None = None, defer: bool = False
    ):
        """Standard RAG: everything from scratch, positions 0..len-1, then `extra` tokens. Returns the logits
        of the prompt's last token and of each extra token (1 + len(extra), vocab)."""
        cache = hf_compat.buffered_cache(self.lm.config.num_hidden_layers, reserve=reserve + len(extra))
        logits = yield from self._feed_steps(
            cache, prompt.ids + extra, 0, 1 + len(extra), step=step, defer=defer
        )
        return Prefilled(cache, logits, len(prompt.ids), 0, 0)

    def _prefill_turbo(
        self,
        prompt: Prompt,
        mode: str,
        reserve: int,
        extra: list[int],
        step: int | None = None,
        defer: bool = False,
        persist: bool | WriteBudget = True,
        collection: str | None = None,
    ):
        """Load and assemble the chunk caches, then prefill only the question (and `extra` tokens). Returns
        the ApeContext the sequence decodes with too (None but in the APE modes)."""
        ctx = self.assemble(prompt, mode, reserve + len(extra), persist, collection)
        attention = self.ape_context(ctx.cache, prompt) if modes.get(mode).ape else None
        ids = prompt.suffix + extra
        logits = yield from self._feed_steps(
            ctx.cache, ids, ctx.next_pos, 1 + len(extra), attention, step, defer, self.query_adapter
        )
        end = ctx.next_pos + len(prompt.suffix)
        return Prefilled(ctx.cache, logits, end, ctx.cached, ctx.computed, attention, self.query_adapter)

    def ape_context(self, cache, prompt: Prompt) -> ape.ApeContext:
        """APE's context keys in this assembled cache: cache indices [prefix, prefix + passages), which a
        sliding layer holding only the tail from `offset` on sees shifted by that offset."""
        offsets = [getattr(layer, "offset", 0) for layer in cache.layers]
        start = len(prompt.prefix)
        lo, hi = ape.context_span(offsets, start, start + prompt.context_tokens, self.lm.device)
        free = self.training_free
        return ape.ApeContext(lo, hi, free.ape_temperature, free.ape_scale)

    def assemble(
        self,
        prompt: Prompt,
        mode: str,
        reserve: int,
        persist: bool | WriteBudget = True,
        collection: str | None = None,
    ) -> Assembled:
        """The turbo context: chunk caches loaded (missing ones computed, and stored if `persist`; a
        WriteBudget is charged their bytes first, and may refuse with QuotaExceeded),
        re-positioned and written after the prefix cache, [recomputed].

        Sliding-window layers hold only the tail of the context they can still see, and only the layers a
        chunk contributes to are read from the store. The recompute modes refresh tokens anywhere in the
        context, so they assemble every layer whole.

        A chunk read in place (TieredStore.read) that fails its check halfway through assembly has been
        logged and deleted by the store, so the next attempt misses it and computes it: each attempt but the
        last removes one damaged chunk, so there are at most one more attempts than chunks.
        """
        for _ in range(len(prompt.chunks) + 1):
            try:
                return self._assemble_once(prompt, mode, reserve, persist, collection)
            except Damaged:
                continue
        raise Damaged(f"the request's chunk caches kept failing their checks ({len(prompt.chunks)} chunks)")

    def _assemble_once(
        self, prompt: Prompt, mode: str, reserve: int, persist: bool | WriteBudget, collection: str | None
    ) -> Assembled:
        positions, strategy = modes.get(mode).positions, modes.get(mode).recompute
        dev, dtype = self.lm.device, self.lm.dtype
        windows = self.windows if strategy is None else [None] * len(self.windows)
        lengths = [len(c) for c in prompt.chunks]
        keys = [self.key(c, collection) for c in prompt.chunks]
        wanted: dict[str, set[int]] = {}
        for k, layers in zip(keys, kv.needed_layers(lengths, len(prompt.prefix), windows)):
            wanted.setdefault(k, set()).update(layers)
        loaded = self.caches.read({k: sorted(layers) for k, layers in wanted.items()}, len(self.windows))
        missing = {k: ids for k, ids in zip(keys, prompt.chunks) if loaded[k] is None}
        if missing:
            if isinstance(persist, WriteBudget):  # before any model work: a refusal costs nothing
                persist.charge(sum(self.cache_bytes(len(ids)) for ids in missing.values()))
            loaded.update(self._compute_and_store(missing, keep=True, persist=persist is not False))
        chunks = [loaded[k] for k in keys]
        cache, next_pos = kv.assemble_into(
            self.prefix_kv, chunks, self.inv_freq, positions, dev, dtype, reserve, windows, lengths
        )
        recomputed = 0
        if strategy is not None:
            recomputed = self._recompute(cache, prompt, positions, strategy)
        cached = len(prompt.prefix) + prompt.context_tokens - recomputed
        return Assembled(cache, next_pos, cached, len(missing))

    def cache_bytes(self, tokens: int) -> int:
        """Bytes of a chunk's K/V tensors of `tokens` tokens in the store's format (file header aside)."""
        layers, kv_heads, head_dim = kv_shape(self.lm.model)
        return tensor_bytes(self.store.cache_format, layers, kv_heads, tokens, head_dim)

    def prefill_question(self, cache, prompt: Prompt, next_pos: int, scored: bool = False) -> torch.Tensor:
        """Run the question on top of an assembled context; returns the last position's logits (vocab,).
        With `scored` and an abstention threshold, the abstention reply rides in the same forward and its
        log-probability is read off, as a request does before its first token (begin_steps): the same model
        work, for a floor that compares like with like."""
        extra = self.scored_reply if scored else []
        ids = prompt.suffix + extra
        logits = self._feed(cache, ids, next_pos, 1 + len(extra), adapter=self.query_adapter)  # (1+E, vocab)
        if scored and self.abstain_threshold is not None:
            reply_logprob(logits, self.abstain_ids)  # its cost, not its value: the floor decides nothing
        return logits[0]

    def _feed(
        self,
        cache,
        ids: list[int],
        start: int,
        keep: int,
        attention: ape.ApeContext | None = None,
        adapter: bool = False,
    ) -> torch.Tensor:
        """Feed `ids` at positions start.. on top of `cache`; the logits of the last `keep` (keep, vocab).
        `adapter`: they are query tokens, read through the query-side adapter if the model has one."""
        return drain(self._feed_steps(cache, ids, start, keep, attention, adapter=adapter))

    def _feed_steps(
        self,
        cache,
        ids: list[int],
        start: int,
        keep: int,
        attention: ape.ApeContext | None = None,
        step: int | None = None,
        defer: bool = False,
        adapter: bool = False,
    ) -> Generator[int | Feed, torch.Tensor | None, torch.Tensor]:
        """`_feed` in forwards of at most `step` (else `prefill_step`, else all) tokens, the last holding
        the `keep` tokens whose logits are wanted, whatever their number; yields each forward's token count
        (with `defer`: the forward itself, as a Feed whose logits are sent back). Each forward sees the cache
        the ones before it wrote: the result is one forward's, to float rounding (tested)."""
        step, cut = step or self.prefill_step or max(1, len(ids)), max(0, len(ids) - keep)
        pieces = [ids[i : min(i + step, cut)] for i in range(0, cut, step)]
        tail = ids[cut:]
        if pieces and len(pieces[-1]) + len(tail) <= step:
            pieces[-1] = pieces[-1] + tail
        else:
            pieces.append(tail)
        for n, piece in enumerate(pieces):
            last = n == len(pieces) - 1
            feed = Feed(self.lm.model, cache, piece, start, keep if last else 1, attention, adapter)
            if defer:
                logits = yield feed
            else:
                logits = feed.run()
                yield len(piece)
            start += len(piece)
        return logits

    def _recompute(self, cache, prompt: Prompt, positions: str, strategy: str) -> int:
        """Refresh a few context tokens in place (recompute.py: `strategy` epic or blend); how many."""
        p, lengths = len(prompt.prefix), [len(c) for c in prompt.chunks]
        shifts, _ = kv.layout(lengths, p, positions)
        ids = prompt.prefix + [t for c in prompt.chunks for t in c]
        pos = list(range(p)) + [p + d + j for d, n in zip(shifts, lengths) for j in range(n)]
        if strategy == "epic":
            selected = recompute.epic_indices(p, lengths, self.training_free.recompute_k)
        else:
            first = p + (lengths[0] if lengths else 0)
            ratio = self.training_free.recompute_ratio
            selected = recompute.blend_indices(self.lm.model, cache, ids, pos, first, ratio)
        recompute.recompute(self.lm.model, cache, ids, pos, selected)
        return len(selected)
