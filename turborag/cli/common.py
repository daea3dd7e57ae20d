"""What every command shares: the stderr console, one-line errors, and the options used by several commands.

Each command module imports from here (never from `app.py`), so the command modules do not depend on each
other's registration and the package has no import cycle.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from turborag.core.defaults import BASE_MODEL, DEFAULT_MODEL, QWEN_MODEL
from turborag.store.settings import CACHE_FORMATS

console = Console(stderr=True)


def stdout() -> Console:
    """Tables on stdout; when piped (no terminal width), wide enough that columns are not cut."""
    c = Console()
    return c if c.is_terminal else Console(width=160)


def fail(message: str, code: int = 2) -> None:
    """One clear line on stderr, no traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def int_list(value: str, option: str) -> list[int]:
    """'512,2048' -> [512, 2048]; anything else is one clear error line."""
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        fail(f"{option} must be comma-separated positive integers, got {value!r}")
    return out


# Options of the commands that load a model by name (demo, eval, bench).
ModelOpt = typer.Option(
    DEFAULT_MODEL,
    "--model",
    help=f"{DEFAULT_MODEL} (default), {BASE_MODEL} (its base), {QWEN_MODEL} (a 1.5B instruct model, "
    "fetched on first use), an HF model or adapter folder, a .gguf",
)
DeviceOpt = typer.Option("cpu", "--device", help="cpu, cuda, cuda:N or auto")
DtypeOpt = typer.Option(
    "auto",
    "--dtype",
    help="compute dtype: auto (bf16 where the CPU or GPU has it in hardware, else fp32), float32, bfloat16, "
    "float16",
)
TemplateOpt = typer.Option(
    "auto", "--template", help="prompt template: auto (chat if the model has one), plain, chat"
)

AbstainThresholdOpt = typer.Option(
    None,
    "--abstain-threshold",
    min=0.0,
    max=1.0,
    help='abstain when the model gives the reply "The passages do not say." at least this probability '
    "(default: the fine-tune's recorded threshold, none for other models; 0 = greedy decoding alone)",
)


NameCheckOpt = typer.Option(
    None,
    "--name-check/--no-name-check",
    help='answer "The passages do not say." when the question names code or a proper name (two capitalized '
    "words) that no passage mentions (default: on for a fine-tune that records it, off for other models)",
)


DecodeWeightsOpt = typer.Option(
    "float",
    "--decode-weights",
    help="weights the decode steps read: float (the model's), int8 (8-bit copies) or int4 (4-bit copies of "
    "the layers a Q4 GGUF holds exactly, int8 for the rest); the copies are CPU only, fewer bytes per "
    "token; prefills and stored caches keep the float weights",
)


def answer_options(abstain_threshold: float | None, name_check: bool | None, decode_weights: str = "float"):
    """The engine options of --abstain-threshold, --name-check and --decode-weights: None keeps what the
    model records, a threshold of 0 turns it off (core/options.py)."""
    from turborag.core.options import EngineOptions

    try:
        return EngineOptions(
            abstain_threshold=abstain_threshold, name_check=name_check, decode_weights=decode_weights
        )
    except ValueError as e:
        fail(str(e))


# Options of the commands that work on a store (ingest, ask, remove, cache): the store remembers its model.
StoreOpt = typer.Option(None, "--store", help="store directory (default: $TURBORAG_HOME/store)")
StoreModelOpt = typer.Option(
    None,
    "--model",
    help=f"{DEFAULT_MODEL}, {BASE_MODEL}, {QWEN_MODEL}, an HF model or adapter folder or a .gguf file "
    "(default: the store's model)",
)
StoreTemplateOpt = typer.Option(None, "--template", help="auto, plain or chat (default: the store's)")
StoreDtypeOpt = typer.Option(
    None,
    "--dtype",
    help="compute dtype: auto, float32, bfloat16, float16 (default: the store's; auto for a new store)",
)
JsonOpt = typer.Option(False, "--json", help="print one JSON object")
CollectionOpt = typer.Option(
    "default",
    "--collection",
    "-c",
    help="the store's collection to work on (retrieval never crosses collections; ingest creates it)",
)
StoreUrlOpt = typer.Option(
    None,
    "--store-url",
    help="where a new store keeps its chunk caches: file:///path, redis://host:port/db or "
    "redis+cluster://host:port (default: the store's own folder); recorded in the store",
)


def parse_bytes(text: str) -> int:
    """`2G`, `512M`, `64k` or a plain number of bytes -> bytes (powers of 1024); ValueError otherwise."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use e.g. 2G, 512M or a number of bytes)") from None
    if value < 0:
        raise ValueError(f"a size must not be negative: {text!r}")
    return int(value * units[unit])


def plural(n: int, word: str, plural_word: str | None = None) -> str:
    """A count with its noun in the right number: plural(1, "chunk cache") == "1 chunk cache",
    plural(3, "chunk cache") == "3 chunk caches". The count messages people read go through here, so
    "1 documents" cannot slip back in; `plural_word` is for nouns that do not just take an "s" ("entries")."""
    return f"{n} {word if n == 1 else plural_word or word + 's'}"


def parse_cache_format(name: str | None) -> str | None:
    """`--cache-format`, with the short names fp16/bf16 accepted."""
    if name is None:
        return None
    aliases = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
    name = aliases.get(name, name)
    if name not in CACHE_FORMATS:
        fail(f"unknown --cache-format {name!r}: use one of {', '.join(CACHE_FORMATS)}")
    return name


PlotOpt = typer.Option(
    None, "--plot", help="also draw the results as a PNG to this file (needs matplotlib: the `plot` extra)"
)


def check_plot(plot: Path | None) -> None:
    """Fail before measuring anything if --plot is asked for and matplotlib is missing."""
    if plot is not None:
        from turborag.bench.plots import PlotUnavailable, require

        try:
            require()
        except PlotUnavailable as e:
            fail(str(e))


def write_plot(plot: Path | None, draw, result: dict) -> None:
    """Draw `result` (the command's JSON object) with `draw` into the file `plot`, if one was given. Called
    after the results are printed, so that a plot that cannot be written loses no measurement."""
    if plot is not None:
        try:
            draw(result, plot)
        except OSError as e:
            fail(f"could not write the plot {plot}: {e.strerror or e}", code=1)
        console.print(f"plot: {plot}")
