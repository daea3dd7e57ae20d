"""`turborag calibrate`: the training-free mode for a model, chosen on the user's own questions.

The measuring and the record are eval/calibrate.py's; this is the command line around them."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from turborag.cli.common import DeviceOpt, DtypeOpt, JsonOpt, ModelOpt, TemplateOpt, fail, stdout
from turborag.cli.loading import engine_for


def calibrate(
    data: Path = typer.Argument(
        ...,
        help="JSONL of your own validation questions, as `turborag eval` reads them ({question, answers, "
        "contexts} per line); not an evaluation benchmark such as RGB",
    ),
    model: str = ModelOpt,
    limit: int = typer.Option(100, min=1, help="the first N usable questions"),
    device: str = DeviceOpt,
    template: str = TemplateOpt,
    dtype: str = DtypeOpt,
    store: Path = typer.Option(None, help="cache store (default: $TURBORAG_HOME/eval-store)"),
    max_new_tokens: int = typer.Option(32, min=1),
    unanswerable: Path = typer.Option(
        None,
        help="JSONL of your own questions the passages do not answer (`answerable: false`, such as topical "
        "twins of DATA's): also choose an abstention threshold on them and DATA's questions",
    ),
    max_false_abstain: float = typer.Option(
        0.0,
        min=0.0,
        max=1.0,
        help="with --unanswerable: the share of DATA's questions it may decline",
    ),
    write: bool = typer.Option(
        True, "--write/--dry-run", help="record the choice next to the model (--dry-run only prints it)"
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Answer your questions in full and in every training-free mode; record the best for `--mode auto`."""
    for path in (data, unanswerable):
        if path is not None and not path.is_file():  # before the imports below, which load torch
            fail(f"no such file: {path}")
    from turborag.core.files import sha256_file
    from turborag.eval.calibrate import calibrate as run
    from turborag.eval.calibrate import calibrate_abstention, candidate, write_record

    examples = _examples(data, limit)
    declinable = _examples(unanswerable, limit) if unanswerable else []
    if unanswerable and any(e.answerable for e in declinable):
        fail(f"{unanswerable}: every record must have `answerable: false`")
    if unanswerable and not any(e.answerable for e in examples):
        fail(f"{data}: no answerable question to hold the threshold against")
    engine = engine_for(model, device, store, template, dtype)
    if engine.lm.cache_aware:
        note = f"note: {model} is a cache-aware fine-tune, so `auto` answers in turbo whatever is recorded"
        typer.echo(note, err=True)
    say = (lambda _: None) if as_json else (lambda line: typer.echo(line, err=True))
    # progress goes to stderr, --json or not: a calibration is many minutes of model work on a CPU
    record = run(engine, examples, max_new_tokens=max_new_tokens, progress=True, say=say)
    record["data"] = {"path": str(data), "sha256": sha256_file(data)}
    if declinable:
        answerable = [e for e in examples if e.answerable]
        chosen_engine = candidate(engine, record["settings"])  # scored as `auto` will answer
        try:
            chosen = calibrate_abstention(
                chosen_engine, answerable, declinable, record["mode"], max_false_abstain, say=say
            )
        except ValueError as e:
            fail(f"{data}: {e}")
        chosen["data"] = {"path": str(unanswerable), "sha256": sha256_file(unanswerable)}
        record["abstain"] = chosen
        record["abstain_threshold"] = chosen["threshold"]
    if write:
        if engine.lm.folder is None:
            fail(f"{model}: no folder to record the calibration in")
        try:
            record["written"] = str(write_record(engine.lm.folder, record))
        except OSError as e:
            fail(f"cannot write the calibration next to {model}: {e}")
    if as_json:
        typer.echo(json.dumps(record))
        return
    _print(record)


def _examples(path: Path, limit: int) -> list:
    """The usable questions of `path` (bad lines warned about), or exit: none, or an evaluation benchmark."""
    from turborag.eval.calibrate import check_not_a_benchmark
    from turborag.eval.evaluate import load_examples

    try:
        check_not_a_benchmark(path)
    except ValueError as e:
        fail(str(e))
    examples, problems = load_examples(path, limit)
    for p in problems:
        typer.echo(f"warning: skipped {path}:{p}", err=True)
    if not examples:
        fail(f"{path}: no usable question ({len(problems)} bad lines)")
    return examples


def _print(record: dict) -> None:
    from turborag.core.engine import calibration_warnings  # torch: loaded by the run already

    table = Table(title=f"{record['model']}: {record['n']} questions")
    for col in ("mode", "accuracy", "TTFT p50 (s)"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    table.add_row("full", f"{record['full_accuracy']:.1%}", f"{record['full_ttft_s_p50']:.3f}")
    for c in record["candidates"]:
        mark = " (chosen)" if c["label"] == record["label"] else ""
        table.add_row(c["label"] + mark, f"{c['accuracy']:.1%}", f"{c['ttft_s_p50']:.3f}")
    out = stdout()
    out.print(table)
    gap = record["full_accuracy"] - record["accuracy"]
    verdict = "within 3 points of full" if record["within_3_points"] else f"{gap:.1%} below full"
    out.print(f"chosen: {record['label']}, {verdict}")
    for warning in calibration_warnings(record):
        out.print(f"note: {warning}")
    if (chosen := record.get("abstain")) is not None:
        _print_abstain(chosen)
    if "written" in record:
        where = record["written"]
        out.print(f"recorded in {where}: `--mode auto` now answers in {record['mode']} on this model")


def _print_abstain(chosen: dict) -> None:
    modes = list(chosen["thresholds"][0]["abstain"])
    table = Table(
        title=f"abstention: {chosen['n_unanswerable']} unanswerable, {chosen['n_answerable']} answerable"
    )
    table.add_column("threshold", justify="right")
    for m in modes:
        table.add_column(f"{m}: declined", justify="right")
        table.add_column(f"{m}: falsely declined", justify="right")
    for row in chosen["thresholds"]:
        mark = " (chosen)" if row["threshold"] == chosen["threshold"] else ""
        cells = [f"{row[k][m]:.1%}" for m in modes for k in ("abstain", "false_abstain")]
        table.add_row(f"{row['threshold']}{mark}", *cells)
    out = stdout()
    out.print(table)
    if chosen["threshold"] is None:
        bound = chosen["max_false_abstain"]
        out.print(
            f"no threshold declines an unanswerable question while declining at most {bound:.0%} of the rest"
        )
