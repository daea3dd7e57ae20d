"""`turborag data`: QA sets for training and evaluation.

`synth`: fictional-fact multi-document QA (turborag_research/synth.py); `realtext`: questions over the
standard library's documentation (turborag_research/realtext.py); `mix`: the cache-aware fine-tune's
training mix and its held-out sets (turborag_research/mix.py); `langref`: the hand-written demo-corpus
questions with the passages the demo retrieves for them. The generators are research code, apart from the
runtime: each command imports them when it runs, never at import.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from turborag.cli.common import fail
from turborag.core.defaults import turborag_home

app = typer.Typer(help="Data sets for development and evaluation.", no_args_is_help=True)


@app.command("synth")
def synth_cmd(
    n: int = typer.Option(100, "--n", min=1, help="number of questions"),
    contexts: int = typer.Option(5, "--contexts", min=1, help="passages per question (one holds the answer)"),
    out: Path = typer.Option(..., "--out", help="output JSONL"),
    seed: int = typer.Option(0),
    domains: str = typer.Option(None, help="comma-separated domains for the questions (default: all)"),
    exclude: str = typer.Option(
        None, help="comma-separated domains to leave out (e.g. held-out eval domains)"
    ),
    max_contexts: int = typer.Option(None, min=1, help="vary passages per question from --contexts to this"),
    families: str = typer.Option(
        "legacy",
        help="template families (question wording, passage layout, answer type; "
        "turborag_research/families.py): legacy (the template's question over prose passages), all, seen "
        "(none held out), or unseen (each question with a held-out wording, layout or answer type)",
    ),
) -> None:
    """Multi-document QA over fictional facts (only the passages can answer)."""
    import random

    from turborag_research.families import FAMILY_SETS
    from turborag_research.synth import DOMAINS, generate, write_jsonl

    if families not in FAMILY_SETS:
        fail(f"--families must be one of {', '.join(FAMILY_SETS)}, got {families!r}")
    doms = [d.strip() for d in domains.split(",")] if domains else list(DOMAINS)
    if exclude:
        doms = [d for d in doms if d not in {x.strip() for x in exclude.split(",")}]
    try:
        if max_contexts is None or max_contexts <= contexts:
            records = generate(n, contexts, seed=seed, domains=doms, families=families)
        else:  # varied passage counts: one generator call per question, each with its own seed
            rng = random.Random(seed)
            records = [
                generate(
                    1,
                    rng.randint(contexts, max_contexts),
                    seed=seed * 100_003 + i,
                    domains=doms,
                    families=families,
                )[0]
                for i in range(n)
            ]
    except ValueError as e:
        fail(f"{e} (domains: {', '.join(DOMAINS)})")
    write_jsonl(records, out)
    typer.echo(f"wrote {len(records)} questions with {contexts} passages each to {out}", err=True)


@app.command("realtext")
def realtext_cmd(
    n: int = typer.Option(100, "--n", min=1, help="number of questions"),
    contexts: int = typer.Option(5, "--contexts", min=1, help="passages per question"),
    split: str = typer.Option("train", help="train, or eval (held-out stdlib modules, never trained on)"),
    unanswerable: float = typer.Option(
        0.0, help="fraction of questions with no answering passage (answer: 'The passages do not say.')"
    ),
    seed: int = typer.Option(0),
    out: Path = typer.Option(..., "--out", help="output JSONL"),
) -> None:
    """Multi-document QA over the Python standard library's docstrings and signatures."""
    if split not in ("train", "eval"):
        fail(f"--split must be train or eval, got {split!r}")
    if not 0.0 <= unanswerable <= 1.0:
        fail(f"--unanswerable must be a fraction from 0 to 1, got {unanswerable}")
    from turborag_research.realtext import generate_realtext
    from turborag_research.synth import write_jsonl

    try:
        records = generate_realtext(n, contexts, seed=seed, split=split, unanswerable=unanswerable)
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    write_jsonl(records, out)
    typer.echo(f"wrote {len(records)} {split} questions with {contexts} passages each to {out}", err=True)


@app.command("mix")
def mix_cmd(
    n: int = typer.Option(4000, "--n", min=1, help="number of training questions"),
    seed: int = typer.Option(0),
    out: Path = typer.Option(..., "--out", help="output JSONL (the training mix)"),
    eval_dir: Path = typer.Option(
        None,
        help="also write the held-out sets here: realtext-eval.jsonl, unanswerable-eval.jsonl and the same "
        "two in documentation layout, realtext-doc-eval.jsonl and unanswerable-doc-eval.jsonl, and "
        "prose-doc-eval.jsonl with its twins without the answering passage, "
        "prose-unanswerable-doc-eval.jsonl, synthetic questions in seen and in held-out template "
        "families, synth-seen-eval.jsonl and synth-unseen-eval.jsonl, and the topical twins of the "
        "synth-unseen and prose-doc questions (the answering passage kept, stripped of the answer), "
        "synth-topical-eval.jsonl and prose-topical-doc-eval.jsonl (150 questions, 5 passages each; 4 for "
        "the prose twins; the topical prose twins leave out the questions that cannot be stripped)",
    ),
    eval_n: int = typer.Option(
        150,
        "--eval-n",
        min=1,
        help="questions per held-out set written to --eval-dir (a larger set "
        "tells smaller gaps apart; the first sets are not a prefix of a larger one)",
    ),
    unanswerable: float = typer.Option(
        0.15, min=0.0, max=1.0, help="share of questions no passage answers (target: the abstention)"
    ),
    synth_answers: str = typer.Option(
        "value", help="target of a synthetic question: the bare value, or the whole fact sentence"
    ),
    doc_style: float = typer.Option(
        0.5,
        min=0.0,
        max=1.0,
        help="share of real-text questions whose passages are laid out as documentation pages "
        "(title, paragraphs, wrapped lines)",
    ),
    paired: float = typer.Option(
        0.0,
        min=0.0,
        max=1.0,
        help="share of the unanswerable questions that are twins of answerable ones in the mix: the same "
        "question and passages without the one that answers it (0: all independent); with --topical, the "
        "share of topical questions that come with the answerable question each was made from",
    ),
    prose: float = typer.Option(
        0.0,
        min=0.0,
        max=1.0,
        help="share of the questions (answerable and unanswerable alike) asked in plain English about a "
        "sentence of the stdlib documentation ('How is X defined?', 'What happens in f if ...?')",
    ),
    synth_unanswerable: float = typer.Option(
        0.5,
        min=0.0,
        max=1.0,
        help="share of the other unanswerable questions that are synthetic near-namesake ones (the rest "
        "stdlib); with --paired they are twins of synthetic answerable questions",
    ),
    topical: float = typer.Option(
        0.0,
        min=0.0,
        max=1.0,
        help="share of the unanswerable questions that keep the answering passage with the sentences that "
        "answer taken out, so the passages still name the asked entity (synthetic or plain-English stdlib)",
    ),
    families: str = typer.Option(
        "seen",
        help="template families of the synthetic questions (turborag_research/families.py): seen (no "
        "held-out wording, layout or answer type), legacy (the template's question over prose passages, any "
        "answer type), or all (held-out families too)",
    ),
) -> None:
    """The cache-aware fine-tune's training mix: hard synthetic and stdlib text half each, plus a share of
    unanswerable questions; 60% of questions with 8-32 passages."""
    if eval_dir is not None and eval_dir.exists() and not eval_dir.is_dir():
        fail(f"--eval-dir {eval_dir} is not a directory")
    from turborag_research.mix import MIX_FAMILIES, build_eval_sets, build_mix
    from turborag_research.synth import write_jsonl

    if synth_answers not in ("value", "sentence"):
        fail(f"--synth-answers must be value or sentence, got {synth_answers!r}")
    if families not in MIX_FAMILIES:
        fail(f"--families must be one of {', '.join(MIX_FAMILIES)}, got {families!r}")
    records = build_mix(
        n,
        seed,
        unanswerable,
        synth_answers,
        doc_style,
        paired=paired,
        prose=prose,
        synth_unanswerable=synth_unanswerable,
        families=families,
        topical=topical,
    )
    write_jsonl(records, out)
    typer.echo(f"wrote {len(records)} training questions to {out}", err=True)
    if eval_dir is not None:
        for name, rows in build_eval_sets(n=eval_n, seed=seed).items():
            path = eval_dir / f"{name}-eval.jsonl"
            write_jsonl(rows, path)
            typer.echo(f"wrote {len(rows)} held-out questions to {path}", err=True)


@app.command("langref")
def langref_cmd(
    out: Path = typer.Option(..., "--out", help="output JSONL (the eval file)"),
    store: Path = typer.Option(None, help="the demo's store (default: $TURBORAG_HOME/demo-store)"),
    top_k: int = typer.Option(3, "--top-k", min=1, help="passages per question (the demo reads 3)"),
    keep_misses: bool = typer.Option(
        False, "--keep-misses", help="keep answerable questions whose passages miss the answer"
    ),
    questions: str = typer.Option(
        "langref_qa.jsonl",
        help="question file in turborag/data: langref_qa.jsonl, or langref_names_qa.jsonl (questions naming "
        "code the way users write it, `__exit__()`, `os.path.join`, for the name check)",
    ),
) -> None:
    """Eval file over the demo corpus: the hand-written questions, each with the passages the demo retrieves.

    The questions (turborag/data/langref_qa.jsonl) are in plain English, each with short spans of the
    corpus (26 sections of the CPython language reference, evaluation only) that a right answer contains;
    some ask about what the corpus does not cover, and their right answer is the abstention. The passages
    are each question's top-k chunks from the store `turborag demo` made. An answerable question whose
    chunks contain none of its spans measures retrieval, not reading: it is left out (and counted) unless
    --keep-misses. Then: `turborag eval OUT --modes full,turbo --max-new-tokens 48`."""
    from importlib.resources import files

    from turborag.eval.metrics import contains_answer

    root = store or turborag_home() / "demo-store"
    if not (root / "catalog.sqlite").exists():
        fail(f"{root} has no catalog: run `turborag demo` (or ingest turborag/data/corpus) first")
    source = files("turborag").joinpath("data", questions)
    if not source.is_file():
        fail(
            f"no question file {questions!r} in turborag/data: use langref_qa.jsonl or langref_names_qa.jsonl"
        )
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]

    from turborag.rag.embed import Embedder  # sentence-transformers: after the argument checks
    from turborag.rag.retrieve import Retriever
    from turborag.store.catalog import Catalog

    catalog = Catalog(root, read_only=True)
    try:
        retriever = Retriever(catalog, Embedder())
        kept, misses = [], 0
        for row in rows:
            contexts = [passage.text for passage in retriever.search(row["question"], top_k)]
            answerable = row.get("answerable", True)
            if answerable and not any(contains_answer(c, row["answers"]) for c in contexts):
                misses += 1
                if not keep_misses:
                    continue
            kept.append({**row, "contexts": contexts, "answerable": answerable, "source": "langref"})
    finally:
        catalog.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    n_out = sum(not r["answerable"] for r in kept)
    typer.echo(
        f"wrote {len(kept)} questions ({len(kept) - n_out} answerable, {n_out} unanswerable) to {out}; "
        f"{misses} answerable questions whose top-{top_k} passages miss the answer "
        + ("kept" if keep_misses else "left out"),
        err=True,
    )
