"""The `turborag` command line, assembled in one place.

Each command lives in the module of its group (`demo.py`, `evaluate.py`, `documents.py`, `ask.py`,
`serve.py`, `finetune.py`, and the sub-apps `data.py`, `bench.py`, `cache.py`, `keys.py`) as a plain
function or a typer sub-app; none of them imports this module, so registration order is decided here and
nowhere else. Each command is a thin shell over one module below the CLI.
"""

from __future__ import annotations

import gc
import logging
import sys
import warnings

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

from turborag.cli import (
    ask,
    bench,
    cache,
    calibrate,
    data,
    demo,
    documents,
    evaluate,
    finetune,
    gate,
    keys,
    rgb,
    serve,
)


class HelpGroup(TyperGroup):
    """A command group whose `--help` lists each command's summary whole, wrapped to the terminal.

    Click shortens a summary to what fits on one line and ends it with "..."; ours are one or two sentences
    and say what the command is for, so they are wrapped instead.
    """

    def format_commands(self, ctx, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, summary(cmd.short_help or cmd.help or "")))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def summary(help_text: str) -> str:
    """The first paragraph of a command's help, on one line (the formatter wraps it)."""
    return " ".join(help_text.strip().split("\n\n")[0].split())


# Plain click help, not rich's: rich's option table gives the help text whatever width the option names,
# types and defaults leave, and at 80 columns cuts words with "…"; click's layout wraps every word whole.
# No help text uses rich markup, which would also eat literal brackets (`pip install 'turborag[ray]'`).
app = typer.Typer(
    help="TurboRAG: RAG answers that start fast, from precomputed chunk KV caches.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=HelpGroup,
)
data.app.command("rgb")(rgb.rgb)  # `turborag data rgb`: its own module, RGB is not our data
app.add_typer(data.app, name="data", cls=HelpGroup)
app.add_typer(bench.app, name="bench", cls=HelpGroup)
app.command()(demo.demo)
app.command("eval")(evaluate.eval_cmd)
app.command()(gate.gate)
app.command()(calibrate.calibrate)
app.command()(finetune.finetune)
app.command()(serve.serve)
app.add_typer(cache.app, name="cache", cls=HelpGroup)
app.add_typer(keys.app, name="keys", cls=HelpGroup)
app.command()(documents.ingest)
app.command()(documents.remove)
app.command()(ask.ask)


# Third-party warnings that say nothing to a user of the command line (they are about the libraries' own
# internals); filtered here, at the entry point, never in the library.
QUIET = [
    (FutureWarning, r".*is_gradient_checkpointing.*"),  # transformers 5.x, on every model load
]


@app.callback()
def _quiet() -> None:
    for category, message in QUIET:
        warnings.filterwarnings("ignore", message=message, category=category)


def main() -> None:
    """The `turborag` command: every error, a bad option value included, is one `error:` line and exit 2.

    Typer's standalone mode draws usage errors as a multi-line box; here they are caught (typer's errors all
    derive from `typer.exceptions.TyperException`) and printed as the rest of turborag's errors are.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        code = app(standalone_mode=False)
    except SystemExit:
        gc.freeze()
        raise
    except TyperException as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `turborag bench`: the group's help, as typer shows it
            e.show()
            sys.exit(2)
        ctx = getattr(e, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        typer.echo(f"error: {e.format_message()}{hint}", err=True)
        sys.exit(getattr(e, "exit_code", 2))
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("interrupted", err=True)
        sys.exit(130)
    # Interpreter shutdown garbage-collects every object torch and transformers made: 1.2 s after a model
    # load. Frozen objects are skipped by that collection; memory goes back to the OS with the process.
    gc.freeze()
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
