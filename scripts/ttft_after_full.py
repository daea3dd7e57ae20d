"""Does turbo (or the floor) measure slower right after a full prefill than after another turbo request?

`bench ttft` alternates full and turbo, so half its turbo measurements follow a full prefill of the whole
context, which leaves the CPU caches full of other data; the floor always follows a turbo request. This
measures each both ways, on `bench ttft`'s store, question and chunks:

    python scripts/ttft_after_full.py --context-tokens 2048 --repeats 9

Prints the medians (ms) and turbo/floor in each position.
"""

from __future__ import annotations

import argparse
import statistics

from turborag.bench.engine import QUESTION, bench_context, floor_ttft
from turborag.core.generate import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context-tokens", type=int, default=2048)
    ap.add_argument("--model", default="gemma-3-270m-turbo")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()

    engine, chunks = bench_context(args.model, args.dtype, args.context_tokens)
    one = SamplingParams(max_new_tokens=1)

    def full() -> float:
        return engine.answer(QUESTION, chunks, "full", one).ttft_s

    def turbo() -> float:
        return engine.answer(QUESTION, chunks, "turbo", one).ttft_s

    def floor() -> float:
        return floor_ttft(engine, QUESTION, chunks)

    for warm in (full, turbo, floor, turbo, floor):  # first-call costs, as bench ttft's warm_up
        warm()
    times: dict[str, list[float]] = {"turbo after full": [], "floor after full": [], "turbo": [], "floor": []}
    for r in range(args.repeats):
        full()
        times["turbo after full"].append(turbo())
        full()
        times["floor after full"].append(floor())
        for name, measure in (
            (("turbo", turbo), ("floor", floor)) if r % 2 else (("floor", floor), ("turbo", turbo))
        ):
            times[name].append(measure())
    ms = {name: 1000 * statistics.median(v) for name, v in times.items()}
    for name, v in ms.items():
        print(f"{name}: {v:.1f} ms")
    print(
        f"turbo / floor after a full prefill: {ms['turbo after full'] / ms['floor after full']:.3f}x; "
        f"after turbo or floor: {ms['turbo'] / ms['floor']:.3f}x"
    )


if __name__ == "__main__":
    main()
