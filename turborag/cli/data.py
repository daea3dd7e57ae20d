"""`turborag data synth`: fictional-fact multi-document QA sets (the work is in train/synth.py)."""

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
) -> None:
    """Multi-document QA over fictional facts (only the passages can answer)."""
    import random

    from turborag.train.synth import DOMAINS, generate, write_jsonl

    doms = [d.strip() for d in domains.split(",")] if domains else list(DOMAINS)
    if exclude:
        doms = [d for d in doms if d not in {x.strip() for x in exclude.split(",")}]
    try:
        if max_contexts is None or max_contexts <= contexts:
            records = generate(n, contexts, seed=seed, domains=doms)
        else:  # varied passage counts: one generator call per question, each with its own seed
            rng = random.Random(seed)
            records = [
                generate(1, rng.randint(contexts, max_contexts), seed=seed * 100_003 + i, domains=doms)[0]
                for i in range(n)
            ]
    except ValueError as e:
        fail(f"{e} (domains: {', '.join(DOMAINS)})")
    write_jsonl(records, out)
    typer.echo(f"wrote {len(records)} questions with {contexts} passages each to {out}", err=True)
