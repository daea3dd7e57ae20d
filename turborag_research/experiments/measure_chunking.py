"""How the default chunk size and overlap were chosen (docs/USING.md, "Chunk size").

    python -m turborag_research.experiments.measure_chunking [--no-precompute]

For chunk sizes 128 / 256 / 512 (overlap 1/8 of the size) on CPython's 79 documentation topics, chunked with
the default model's tokenizer:
- retrieval: share of 24 questions whose topic is among the top-1 / top-3 retrieved chunks (MiniLM);
- MiniLM truncation: share of chunks longer than MiniLM's 256 word-piece window (their tail is invisible to
  retrieval);
- storage: chunk tokens stored per document token (overlap costs cache bytes and precompute time);
- precompute: tokens/s of the real model on ~2k tokens of chunks of each size (`--no-precompute` skips it).
"""

from __future__ import annotations

import sys
import tempfile
import time

QUESTIONS = [
    ("What does the pass statement do?", {"pass"}),
    ("Which exception is raised when an assert statement fails?", {"assert"}),
    ("What does the break statement do inside a loop?", {"break"}),
    ("What does the global statement declare?", {"global"}),
    ("What kind of object does a lambda expression create?", {"lambda"}),
    ("What does the nonlocal statement do?", {"nonlocal"}),
    ("What does the del statement do to a name?", {"del"}),
    ("Which special method implements the in membership test?", {"in"}),
    ("How are augmented assignments such as x += 1 evaluated?", {"augassign"}),
    ("What does the return statement do in a generator function?", {"return"}),
    ("How is a floating point literal written?", {"floating"}),
    ("What does the import statement do?", {"import"}),
    ("How is a right shift by n bits defined?", {"shifting"}),
    ("What does an imaginary literal yield?", {"imaginary"}),
    ("Is there a limit for the length of integer literals?", {"integers"}),
    ("Which values are considered false in a truth value test?", {"truth"}),
    ("What does the with statement do with a context manager?", {"with", "context-managers"}),
    ("How do you raise an exception with an explicit cause?", {"raise"}),
    ("When does the finally clause of a try statement run?", {"try"}),
    ("When does a while loop run its else clause?", {"while"}),
    ("What does a yield expression do?", {"yield"}),
    ("What is the Ellipsis object?", {"bltin-ellipsis-object"}),
    ("What does the continue statement do?", {"continue"}),
    ("What does a slicing select?", {"slicings"}),
]


def main() -> None:
    from pydoc_data.topics import topics

    import numpy as np
    from transformers import AutoTokenizer

    from turborag.core.engine import Engine
    from turborag.core.model import default_model_dir, load_model
    from turborag.rag.chunker import Chunker
    from turborag.rag.embed import Embedder, VectorIndex
    from turborag.store.kv_store import KVStore

    tok = AutoTokenizer.from_pretrained(str(default_model_dir()))
    lm = load_model() if "--no-precompute" not in sys.argv else None
    embedder = Embedder()
    doc_tokens = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in topics.values())
    for size in (128, 256, 512):
        overlap = size // 8
        chunker = Chunker(tok, size, overlap)
        chunks = [(name, c) for name in sorted(topics) for c in chunker.chunk(name, topics[name])]
        texts = [c.text for _, c in chunks]
        truncated = np.mean([len(ids) > 256 for ids in embedder.model.tokenizer(texts)["input_ids"]])
        stored = sum(c.tokens for _, c in chunks) / doc_tokens
        index = VectorIndex(np.arange(len(chunks)), embedder.encode(texts))
        top1 = top3 = 0
        for q, names in QUESTIONS:
            got = [chunks[h.rowid][0] for h in index.search(embedder.encode([q])[0], 3)]
            top1 += got[0] in names
            top3 += any(g in names for g in got)
        line = (
            f"size {size:3d} overlap {overlap:2d}: {len(chunks):4d} chunks, retrieval top-1 "
            f"{top1}/{len(QUESTIONS)}, top-3 {top3}/{len(QUESTIONS)}; "
            f"{truncated:.0%} of chunks longer than MiniLM's window; "
            f"{stored:.2f} chunk tokens stored per document token"
        )
        if lm is not None:
            with tempfile.TemporaryDirectory() as tmp:
                engine = Engine(lm, KVStore(tmp))
                sample = texts[len(texts) // 2 :][: max(2, 2048 // size)]
                t = time.perf_counter()
                _, n = engine.precompute(sample)
                line += f"; precompute {n / (time.perf_counter() - t):.0f} tokens/s"
        print(line, flush=True)


if __name__ == "__main__":
    main()
