"""`turborag bench isolation`: what keying chunk caches per collection costs, and the channel it closes.

Two stores hold the same passages in two collections (`a` and `b`): one shares a cache between collections
(the default), one keys caches per collection (`ingest --isolate-collections`). On each, in one run:

- bytes: the cache bytes the two collections take (isolated: one copy each);
- the channel: a reader of a third collection sends a passage as its own (`turborag.contexts`; a read-only
  key, so nothing is stored). A guess is either the exact text of a chunk `a` holds, or a new text of the
  same length. On a shared store the first is found and answers at once: one request confirms what another
  collection holds. Each of `guesses` pairs is measured once per store, interleaved (TTFT of turbo, one
  token), and a sign test says whether the same text was faster than the new one beyond chance.

The engine is timed directly (a server adds the same HTTP time to both guesses).
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from turborag.bench.engine import QUESTION, doc_chunks
from turborag.core.engine import Answer, Engine, drain
from turborag.core.generate import SamplingParams
from turborag.core.options import EngineOptions
from turborag.eval.metrics import paired_difference
from turborag.store.kv_store import KVStore


@dataclass
class IsolationRow:
    cache_keys: str  # shared, per-collection
    cache_bytes: int  # both collections' caches of the same passages
    same_text_ttft_s: float  # median TTFT of a guess that is another collection's exact chunk
    new_text_ttft_s: float  # median TTFT of a guess of new text, as long
    same_faster: int  # pairs in which the same-text guess was faster
    new_faster: int
    p: float  # two-sided sign test over the pairs
    same_text_computed: int  # same-text guesses whose cache the store did not have (isolated: every one)

    @property
    def ratio(self) -> float:
        """new / same: how much faster a right guess answers (1.0: no channel)."""
        return self.new_text_ttft_s / self.same_text_ttft_s


def bench_isolation(
    engine: Engine, guesses: int = 20, chunk_tokens: int = 256, root: Path | None = None, log=print
) -> list[IsolationRow]:
    """The two stores side by side; `engine` lends its model (its own store is not touched)."""
    texts = doc_chunks(engine, 2 * guesses * chunk_tokens, chunk_tokens)
    held, new = texts[:guesses], texts[guesses : 2 * guesses]
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        engines = {}
        for keys, isolate in (("shared", False), ("per-collection", True)):
            options = EngineOptions(template=engine.layout.template, isolate_collections=isolate)
            store = KVStore(Path(tmp) / keys, engine.store.cache_format)
            engines[keys] = e = Engine(engine.lm, store, options)
            for collection in ("a", "b"):  # the same passages in two collections, untimed
                e.precompute(held, collection=collection)
            log(f"filled the {keys} store")
        times = {k: ([], []) for k in engines}  # (same text, new text) TTFTs
        computed = dict.fromkeys(engines, 0)
        for i in range(guesses):
            for keys, e in engines.items():
                ttft, n = _guess(e, held[i])
                times[keys][0].append(ttft)
                computed[keys] += n
                times[keys][1].append(_guess(e, new[i])[0])
        rows = []
        for keys, e in engines.items():
            same, fresh = times[keys]
            faster, slower, p = paired_difference(
                [s < n for s, n in zip(same, fresh)], [n < s for s, n in zip(same, fresh)]
            )
            stored = sum(e.store.size(k) or 0 for k in e.store.keys())
            medians = statistics.median(same), statistics.median(fresh)
            rows.append(IsolationRow(keys, stored, *medians, faster, slower, p, computed[keys]))
    return rows


def _guess(engine: Engine, text: str) -> tuple[float, int]:
    """(TTFT, chunks computed) of a reader's request with `text` as its own passage, nothing stored (a
    read-only key's)."""
    one = SamplingParams(max_new_tokens=1)
    seq = drain(engine.begin_steps(QUESTION, [text], "turbo", one, persist=False, collection="reader"))
    answer = next(item for item in engine.run(seq) if isinstance(item, Answer))
    return answer.ttft_s, answer.computed_chunks


def rows_as_dicts(rows: list[IsolationRow]) -> list[dict]:
    return [{**asdict(r), "ratio": r.ratio} for r in rows]
