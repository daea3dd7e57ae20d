"""`turborag demo`: bundled questions over bundled passages, answered in full and turbo mode side by side.

The passages hold fictional facts (so the answer can only come from them). Their caches are precomputed
first, as ingest would; then each question is answered in both modes and TTFT is compared.
"""

from __future__ import annotations

import json
from importlib.resources import files

from rich.console import Console
from rich.table import Table

from turborag.engine import Engine
from turborag.generate import SamplingParams


def demo_examples() -> list[dict]:
    text = files("turborag").joinpath("data/demo.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_demo(engine: Engine, console: Console) -> list[dict]:
    examples = demo_examples()
    with console.status("precomputing passage caches (offline step)"):
        engine.precompute([c for ex in examples for c in ex["contexts"]])
    params = SamplingParams(max_new_tokens=24, stop_at_newline=True)
    engine.answer("warm up", ["warm up"], "full", SamplingParams(max_new_tokens=1))
    table = Table(title=f"turborag demo: {engine.lm.name} on {engine.lm.device}")
    for col in ("question", "full answer", "turbo answer", "full TTFT", "turbo TTFT", "speedup"):
        table.add_column(col)
    rows = []
    for ex in examples:
        full = engine.answer(ex["question"], ex["contexts"], "full", params)
        turbo = engine.answer(ex["question"], ex["contexts"], "turbo", params)
        rows.append({"question": ex["question"], "full": full, "turbo": turbo})
        table.add_row(
            ex["question"],
            full.text,
            turbo.text,
            f"{full.ttft_s * 1000:.0f} ms",
            f"{turbo.ttft_s * 1000:.0f} ms",
            f"{full.ttft_s / turbo.ttft_s:.1f}x",
        )
    console.print(table)
    console.print(
        "TTFT = time to first token, including loading and assembling cached chunks in turbo mode. "
        "With only ~3 short passages the gap is small; see `turborag bench ttft` for long contexts."
    )
    return rows
