"""`turborag eval`: accuracy and TTFT of several modes (and models, `MODE@MODEL`) on one QA file.

The abstention columns (abstain rate on unanswerable questions, false-abstain rate on answerable ones) are
shown, in the table and the JSON, when they say something: when the file has unanswerable questions
(`"answerable": false`) or some mode abstained at least once.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from turborag.cli.common import (
    AbstainThresholdOpt,
    DecodeWeightsOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    NameCheckOpt,
    TemplateOpt,
    answer_options,
    check_plot,
    fail,
    parse_cache_format,
    stdout,
    write_plot,
)
from turborag.cli.loading import engine_for
from turborag.core.modes import MODES
from turborag.eval.metrics import SCORINGS


def parse_modes(modes: str) -> list[str]:
    out = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in out if m.split("@", 1)[0] not in MODES]
    if bad or not out:
        fail(f"unknown mode {', '.join(bad) or '(none)'}: use one or more of {', '.join(MODES)}")
    return out


def group_by_model(mode_list: list[str], default_model: str) -> dict[str, list[str]]:
    """`MODE` runs on --model, `MODE@MODEL` on another model: {model: [modes]} in first-seen order."""
    groups: dict[str, list[str]] = {}
    for m in mode_list:
        mode, _, spec = m.partition("@")
        groups.setdefault(spec or default_model, []).append(mode)
    return groups


def eval_cmd(
    data: Path = typer.Argument(
        ...,
        help="JSONL: {question, answers: [..], contexts: [..]} per line; answerable: false marks a "
        "question no passage answers (correct iff the model abstains)",
    ),
    modes: str = typer.Option(
        "full,turbo,turbo-composite",
        help="comma-separated modes; MODE@MODEL runs a mode on another model (e.g. turbo@runs/ft/model)",
    ),
    limit: int = typer.Option(None, min=1, help="only the first N usable questions"),
    model: str = ModelOpt,
    device: str = DeviceOpt,
    template: str = TemplateOpt,
    dtype: str = DtypeOpt,
    store: Path = typer.Option(None, help="cache store (default: $TURBORAG_HOME/eval-store)"),
    cache_format: str = typer.Option(
        None,
        "--cache-format",
        help="format of the chunk caches: fp16, bf16, int8 or fp8 (default: the 16-bit compute dtype)",
    ),
    max_new_tokens: int = typer.Option(32, min=1),
    scoring: str = typer.Option(
        "ours",
        help="ours (a gold answer as whole words, Unicode-aware) or rgb (RGB's lower-cased substring of any "
        "alternative; a decline is its 'insufficient information' or ours)",
    ),
    abstain_threshold: float = AbstainThresholdOpt,
    name_check: bool = NameCheckOpt,
    decode_weights: str = DecodeWeightsOpt,
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    predictions: Path = typer.Option(None, help="also write every answer to this JSONL file"),
    plot: Path = typer.Option(
        None,
        "--plot",
        help="also draw accuracy and TTFT per mode (grouped per model) as a PNG to this file (needs "
        "matplotlib: the `plot` extra)",
    ),
) -> None:
    """Accuracy and TTFT of every mode on the same questions and passages."""
    mode_list = parse_modes(modes)
    if scoring not in SCORINGS:
        fail(f"unknown --scoring {scoring!r}: use {' or '.join(SCORINGS)}")
    check_plot(plot)  # before the eval, not after it
    fmt = parse_cache_format(cache_format)
    if not data.is_file():
        fail(f"no such file: {data}")
    # after the checks above: evaluate imports torch, seconds a mistyped argument should not wait for
    from turborag.bench.plots import plot_eval
    from turborag.eval.evaluate import load_examples, run_eval

    examples, problems = load_examples(data, limit)
    for p in problems:
        typer.echo(f"warning: skipped {data}:{p}", err=True)
    if not examples:
        fail(f"{data}: no usable question ({len(problems)} bad lines)")
    preds: list[dict] = []
    results = {}
    threshold, checked = None, None
    for spec, group in group_by_model(mode_list, model).items():  # one model in memory at a time
        options = answer_options(abstain_threshold, name_check, decode_weights)
        engine = engine_for(spec, device, store, template, dtype, fmt, options)
        if spec == model:
            threshold, checked = engine.abstain_threshold, engine.name_check
        got = run_eval(
            engine, examples, group, max_new_tokens, progress=True, predictions=preds, scoring=scoring
        )
        results.update({(m if spec == model else f"{m}@{spec}"): r for m, r in got.items()})
        del engine
    if predictions:
        predictions.write_text("".join(json.dumps(p) + "\n" for p in preds))
    abstentions = _abstentions_apply(examples, results)
    paired = _paired(results)
    out = {
        "modes": {m: _row(r, abstentions) for m, r in results.items()},
        "paired": paired,
        "model": model,
        "abstain_threshold": threshold,  # the one --model answered with
        "name_check": checked,
        "decode_weights": decode_weights,
        "scoring": scoring,
        "skipped_lines": len(problems),
    }
    if as_json:
        typer.echo(json.dumps(out))
    else:
        _print_table(f"{data.name}: {len(examples)} questions, model {model}", results, abstentions, paired)
    write_plot(plot, plot_eval, out)


_ABSTAIN_KEYS = ("abstain_rate", "false_abstain_rate")


def _paired(results: dict) -> dict:
    """Every mode against the reference (`full` if it ran, else the first mode), question by question:
    how many only it got right, how many only the reference did, and the sign test's p (metrics.py), so
    a table says whether a gap between two modes is more than this set's noise."""
    from turborag.eval.metrics import paired_difference

    if len(results) < 2:
        return {}
    ref = "full" if "full" in results else next(iter(results))
    paired = {}
    for m, r in results.items():
        if m != ref:
            only_m, only_ref, p = paired_difference(r.correct, results[ref].correct)
            paired[m] = {"vs": ref, "only_this_right": only_m, "only_vs_right": only_ref, "p": round(p, 4)}
    return paired


def _abstentions_apply(examples: list, results: dict) -> bool:
    """Whether to report abstention rates: unanswerable questions in the file, or any mode abstained."""
    return any(not ex.answerable for ex in examples) or any(r.false_abstain_rate for r in results.values())


def _row(result, abstentions: bool) -> dict:
    """A mode's JSON object; the abstention rates only when they apply."""
    row = vars(result).copy()
    row.pop("correct")
    if not abstentions:
        for key in _ABSTAIN_KEYS:
            row.pop(key, None)
    return row


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _print_table(title: str, results: dict, abstentions: bool = False, paired: dict | None = None) -> None:
    table = Table(title=title)
    columns = ["mode", "n", "accuracy", "exact match"]
    columns += ["abstain", "false abstain"] if abstentions else []
    columns += ["TTFT mean (s)", "TTFT p50 (s)"]
    ref = next(iter(paired.values()))["vs"] if paired else None
    columns += [f"only right / only {ref} right (p)"] if ref else []
    for col in columns:
        table.add_column(col, justify="right" if col != "mode" else "left")
    for m, r in results.items():
        cells = [m, str(r.n), f"{r.accuracy:.1%}", f"{r.exact_match:.1%}"]
        if abstentions:
            cells += [_percent(r.abstain_rate), _percent(r.false_abstain_rate)]
        cells += [f"{r.ttft_s_mean:.3f}", f"{r.ttft_s_p50:.3f}"]
        if ref:
            d = paired.get(m)
            cells.append(f"{d['only_this_right']} / {d['only_vs_right']} (p {d['p']:.2f})" if d else "-")
        table.add_row(*cells)
    stdout().print(table)
    stdout().print(
        "TTFT includes loading and assembling chunk caches; precomputing them is offline and excluded."
    )
    if ref:
        stdout().print(
            f"Last column: questions only this mode got right / only {ref} did, and the sign test's p: "
            "above 0.05, this set cannot tell the two modes apart."
        )
