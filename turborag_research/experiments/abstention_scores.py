"""How well does a model's own probability of the abstention reply tell unanswerable questions from answerable
ones?  If it separated them well, a threshold on it ("abstain when p >= t") would be a training-free way to
raise abstention on questions the passages cannot answer without declining answerable ones.

For every question of an answerable and an unanswerable eval file this scores the log-probability of the
reply "The passages do not say." after the prompt, teacher-forced in one forward on top of the assembled
context (turbo: the chunk caches re-positioned, then question + reply; full: everything prefilled), and
prints the ROC AUC and, per threshold, the share of each set whose probability reaches it:

    python -m turborag_research.experiments.abstention_scores --model runs/ft3/adapter --mode turbo \\
        --limit 80 --answerable runs/eval/realtext-doc-eval.jsonl \\
        --unanswerable runs/eval/unanswerable-doc-eval.jsonl

A threshold decides alone here; greedy decoding abstains on its own besides (see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from turborag.eval.calibrate import abstain_scores, choose_threshold
from turborag.eval.evaluate import load_examples
from turborag.rag.engines import scratch_engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--mode", choices=("turbo", "full"), default="turbo")
    p.add_argument("--answerable", type=Path, required=True)
    p.add_argument("--unanswerable", type=Path, required=True)
    p.add_argument("--limit", type=int, default=None, help="first N questions of each file")
    p.add_argument("--json", type=Path, default=None, help="also write every score here")
    p.add_argument("--store", type=Path, default=None, help="a cache store to reuse (default: in memory)")
    args = p.parse_args()
    engine = scratch_engine(args.model, "cpu", args.store, "auto", "auto")
    a = abstain_scores(engine, load_examples(args.answerable, args.limit)[0], args.mode)
    u = abstain_scores(engine, load_examples(args.unanswerable, args.limit)[0], args.mode)
    # ROC AUC: the chance that an unanswerable question scores above an answerable one (ties count half)
    auc = sum((x > y) + 0.5 * (x == y) for x in u for y in a) / (len(a) * len(u))
    print(f"{args.model} ({args.mode}): {len(a)} answerable, {len(u)} unanswerable, ROC AUC {auc:.3f}")
    print("threshold  abstains on unanswerable  abstains on answerable")
    m = args.mode
    for row in choose_threshold({m: a}, {m: u}, m)["thresholds"]:
        print(f"{row['threshold']:>9}  {row['abstain'][m]:>23.1%}  {row['false_abstain'][m]:>22.1%}")
    if args.json:
        args.json.write_text(json.dumps({"answerable": a, "unanswerable": u, "auc": auc}))


if __name__ == "__main__":
    main()
