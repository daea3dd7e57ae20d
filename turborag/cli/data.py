"""`turborag data`: QA sets for training and evaluation.

`synth`: fictional-fact multi-document QA (train/synth.py); `realtext`: questions over the standard library's
documentation (train/realtext.py); `mix`: the cache-aware fine-tune's training mix and its held-out sets
(train/mix.py).
"""

from __future__ import annotations

from pathlib import Path

import typer

from turborag.cli.common import fail

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
        help="template families (question wording, passage layout, answer type; train/families.py): legacy "
        "(the template's question over prose passages, the output of before), all, seen (none held out), or "
        "unseen (each question with a held-out wording, layout or answer type)",
    ),
) -> None:
    """Multi-document QA over fictional facts (only the passages can answer)."""
    import random

    from turborag.train.families import FAMILY_SETS
    from turborag.train.synth import DOMAINS, generate, write_jsonl

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
    from turborag.train.realtext import generate_realtext
    from turborag.train.synth import write_jsonl

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
        "prose-unanswerable-doc-eval.jsonl, and synthetic questions in seen and in held-out template "
        "families, synth-seen-eval.jsonl and synth-unseen-eval.jsonl (150 questions, 5 passages each; 4 for "
        "the prose twins)",
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
        "(title, paragraphs, wrapped lines); 0 gives the mix made before this option existed",
    ),
    paired: float = typer.Option(
        0.0,
        min=0.0,
        max=1.0,
        help="share of the unanswerable questions that are twins of answerable ones in the mix: the same "
        "question and passages without the one that answers it (0: all independent, as before)",
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
    families: str = typer.Option(
        "seen",
        help="template families of the synthetic questions (train/families.py): seen (no held-out wording, "
        "layout or answer type), legacy (the template's question over prose passages: the mixes made "
        "before this option existed), or all (held-out families too)",
    ),
) -> None:
    """The cache-aware fine-tune's training mix: hard synthetic and stdlib text half each, plus a share of
    unanswerable questions; 60% of questions with 8-32 passages."""
    if eval_dir is not None and eval_dir.exists() and not eval_dir.is_dir():
        fail(f"--eval-dir {eval_dir} is not a directory")
    from turborag.train.mix import MIX_FAMILIES, build_eval_sets, build_mix
    from turborag.train.synth import write_jsonl

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
    )
    write_jsonl(records, out)
    typer.echo(f"wrote {len(records)} training questions to {out}", err=True)
    if eval_dir is not None:
        for name, rows in build_eval_sets(n=eval_n, seed=seed).items():
            path = eval_dir / f"{name}-eval.jsonl"
            write_jsonl(rows, path)
            typer.echo(f"wrote {len(rows)} held-out questions to {path}", err=True)
