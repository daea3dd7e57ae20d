"""Build an eval file over the demo corpus (26 sections of the CPython language reference), with the passages
the demo itself would read: each question's top-k chunks retrieved from a store that `turborag demo` (or
`turborag ingest turborag/data/corpus`) made.

Why: the held-out sets of `turborag data mix --eval-dir` are stdlib docstrings and synthetic facts; the demo's
passages are prose chunks of a reference manual, and a fine-tune can read one well and the other badly (the
third fine-tune answered 72.7% of stdlib questions in turbo and abstained on three of the four demo
questions). The questions (`turborag/data/langref_qa.jsonl`) are written by hand, in plain English, each
with short spans of the corpus that a right answer contains; twelve ask about things the corpus does not
cover, and the right answer to those is the abstention. The language reference is for evaluation only:
nothing here is ever used for training.

    turborag demo                      # makes ~/.cache/turborag/demo-store (or pass --store to both)
    python scripts/langref_eval.py --out langref-eval.jsonl
    turborag eval langref-eval.jsonl --modes full,turbo --max-new-tokens 48

An answerable question whose retrieved chunks contain none of its spans measures retrieval, not reading: it
is left out (and counted) unless --keep-misses is given.
"""

from __future__ import annotations

import argparse
import json
from importlib.resources import files
from pathlib import Path

from turborag.eval.metrics import contains_answer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", type=Path, default=Path.home() / ".cache/turborag/demo-store")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--top-k", type=int, default=3, help="passages per question (the demo reads 3)")
    p.add_argument("--keep-misses", action="store_true", help="keep questions whose passages miss the answer")
    p.add_argument(
        "--questions",
        default="langref_qa.jsonl",
        help="question file in turborag/data: langref_qa.jsonl, or langref_names_qa.jsonl (questions naming "
        "code the way users write it, `__exit__()`, `os.path.join`, for the name check)",
    )
    args = p.parse_args()

    from turborag.rag.embed import Embedder
    from turborag.rag.retrieve import Retriever
    from turborag.store.catalog import Catalog

    if not (args.store / "catalog.sqlite").exists():
        p.error(f"{args.store} has no catalog: run `turborag demo` (or ingest turborag/data/corpus) first")
    questions = files("turborag").joinpath("data", args.questions).read_text(encoding="utf-8")
    rows = [json.loads(line) for line in questions.splitlines() if line.strip()]
    catalog = Catalog(args.store, read_only=True)
    retriever = Retriever(catalog, Embedder())
    kept, misses = [], 0
    for row in rows:
        contexts = [passage.text for passage in retriever.search(row["question"], args.top_k)]
        answerable = row.get("answerable", True)
        if answerable and not any(contains_answer(c, row["answers"]) for c in contexts):
            misses += 1
            if not args.keep_misses:
                continue
        kept.append({**row, "contexts": contexts, "answerable": answerable, "source": "langref"})
    catalog.close()
    args.out.write_text("".join(json.dumps(r) + "\n" for r in kept))
    n_out = sum(not r["answerable"] for r in kept)
    print(
        f"wrote {len(kept)} questions ({len(kept) - n_out} answerable, {n_out} unanswerable) to {args.out}; "
        f"{misses} answerable questions whose top-{args.top_k} passages miss the answer "
        + ("kept" if args.keep_misses else "left out")
    )


if __name__ == "__main__":
    main()
