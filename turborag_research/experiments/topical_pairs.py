"""Answerable questions and their topical twins, side by side, from one of our own record files.

A threshold on the abstention reply's probability is chosen on pairs like these: the same question over the
same passages, once as it is and once with the answering passage stripped of its answer
(`turborag_research.topical.topical_twin`). Only pairs whose twin is clean are kept: no passage of the twin
may still mention an accepted answer (in passages of one article another paragraph often restates it).

    python -m turborag_research.experiments.topical_pairs turborag_research/data/topic_train.jsonl \\
        --skip 300 --limit 40 --out runs/thr/cal     # writes cal-answerable.jsonl and cal-unanswerable.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from turborag_research.text import mentions, needles
from turborag_research.topical import topical_twin


def pairs(records: list[dict]) -> list[tuple[dict, dict]]:
    """(record, its twin) for every record whose twin exists and mentions no accepted answer anywhere."""
    kept = []
    for record in records:
        twin = topical_twin(record)
        found = needles(record["answers"])
        if twin is not None and not any(mentions(c, found) for c in twin["contexts"]):
            kept.append((record, twin))
    return kept


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", type=Path)
    p.add_argument("--skip", type=int, default=0, help="leave out the first N records")
    p.add_argument("--limit", type=int, required=True, help="how many pairs to write")
    p.add_argument("--out", type=Path, required=True, help="prefix: writes PREFIX-answerable.jsonl and ...")
    args = p.parse_args()
    records = [json.loads(line) for line in args.records.read_text().splitlines() if line.strip()]
    kept = pairs(records[args.skip :])[: args.limit]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(("answerable", "unanswerable")):
        path = args.out.parent / f"{args.out.name}-{name}.jsonl"
        path.write_text("".join(json.dumps(pair[i]) + "\n" for pair in kept))
        print(f"{path}: {len(kept)} records")


if __name__ == "__main__":
    main()
