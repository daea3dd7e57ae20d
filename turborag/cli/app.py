"""The `turborag` command line, assembled in one place.

Each command lives in the module of its group (`demo.py`, `evaluate.py`, `documents.py`, `ask.py`,
`serve.py`, `finetune.py`, and the sub-apps `data.py`, `bench.py`, `cache.py`) as a plain function or a typer
sub-app; none of them imports this module, so registration order is decided here and nowhere else. Each
command is a thin shell over one module below the CLI.
"""

from __future__ import annotations

import logging
import sys

import typer

from turborag.cli import ask, bench, cache, data, demo, documents, evaluate, finetune, serve

app = typer.Typer(
    help="TurboRAG: RAG answers that start fast, from precomputed chunk KV caches.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(data.app, name="data")
app.add_typer(bench.app, name="bench")
app.command()(demo.demo)
app.command("eval")(evaluate.eval_cmd)
app.command()(finetune.finetune)
app.command()(serve.serve)
app.add_typer(cache.app, name="cache")
app.command()(documents.ingest)
app.command()(documents.remove)
app.command()(ask.ask)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
