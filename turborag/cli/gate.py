"""`turborag gate CANDIDATE --against CURRENT`: the promotion gate (the work is in eval/gate.py).

Exit 0 when the candidate is no worse than the current model beyond noise on every set and mode, 1 when it
is worse somewhere, 2 on bad input (a missing set file names the command that builds it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from turborag.cli.common import DeviceOpt, DtypeOpt, TemplateOpt, fail
from turborag.core.defaults import turborag_home
from turborag.eval.gate_sets import ALPHA, GATE_MODES, GATE_SETS

RGB_HELP = (
    "RGB (github.com/chen700564/RGB, CC BY-NC-SA 4.0) is not shipped with turborag: build its files with "
    "`turborag data rgb --rgb-json en.json --out rgb/` (docs/RGB.md) and pass --rgb-dir rgb/ (or set "
    "TURBORAG_RGB_DIR)"
)
BUILD_HELP = {
    "synth-unseen": "turborag data mix --n 1 --out /tmp/scratch.jsonl --eval-dir EVAL_DIR",
    "synth-seen": "turborag data mix --n 1 --out /tmp/scratch.jsonl --eval-dir EVAL_DIR",
    "realtext-doc": "turborag data mix --n 1 --out /tmp/scratch.jsonl --eval-dir EVAL_DIR",
    "langref": "turborag demo, then turborag data langref --out EVAL_DIR/langref-eval.jsonl",
}


def _files(names: list[str], rgb_dir: Path | None, eval_dir: Path) -> dict[str, Path]:
    """Each set's file; every missing one is reported at once, with how to build it."""
    from turborag.eval.gate_sets import set_file

    files, missing = {}, []
    for name in names:
        if GATE_SETS[name].where == "rgb" and rgb_dir is None:
            missing.append(f"{name}: no RGB folder. {RGB_HELP}")
            continue
        path = set_file(name, rgb_dir or Path(), eval_dir)
        if path.is_file():
            files[name] = path
        elif GATE_SETS[name].where == "rgb":
            missing.append(f"{name}: no {path}. {RGB_HELP}")
        else:
            missing.append(
                f"{name}: no {path}; build it with: {BUILD_HELP[name].replace('EVAL_DIR', str(eval_dir))}"
            )
    if missing:
        fail("missing gate sets:\n  " + "\n  ".join(missing))
    return files


def gate(
    candidate: str = typer.Argument(..., help="the model to promote: a name, model folder or adapter folder"),
    against: str = typer.Option(..., "--against", help="the model it would replace"),
    sets: str = typer.Option(
        ",".join(GATE_SETS), help=f"comma-separated gate sets, of: {', '.join(GATE_SETS)}"
    ),
    modes: str = typer.Option(",".join(GATE_MODES), help="modes compared on every set"),
    limit: int = typer.Option(100, min=1, help="the first N questions of every set"),
    alpha: float = typer.Option(ALPHA, min=0.0, max=1.0, help="sign-test level of 'worse beyond noise'"),
    rgb_dir: Path = typer.Option(
        None, "--rgb-dir", help="folder of the RGB files (default: $TURBORAG_RGB_DIR)", show_default=False
    ),
    eval_dir: Path = typer.Option(Path("eval"), "--eval-dir", help="folder of our held-out sets"),
    out: Path = typer.Option(
        None, "--out", help="answers per model and set, reused by later gates (default: $TURBORAG_HOME/gate)"
    ),
    device: str = DeviceOpt,
    template: str = TemplateOpt,
    dtype: str = DtypeOpt,
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Promotion gate: CANDIDATE against --against on every gate set, full and turbo, paired sign tests."""
    from turborag.cli.loading import engine_for
    from turborag.core.model import ModelError
    from turborag.core.modes import check_mode
    from turborag.eval import gate as g

    names = [s.strip() for s in sets.split(",") if s.strip()]
    unknown = [n for n in names if n not in GATE_SETS]
    if unknown or not names:
        fail(f"unknown gate set {', '.join(unknown) or '(none)'}: use {', '.join(GATE_SETS)}")
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    try:
        for m in mode_list:
            check_mode(m)
    except ValueError as e:
        fail(str(e))
    if rgb_dir is None and os.environ.get("TURBORAG_RGB_DIR"):
        rgb_dir = Path(os.environ["TURBORAG_RGB_DIR"])
    files = _files(names, rgb_dir, eval_dir)
    out = out or turborag_home() / "gate"
    labels = {candidate: g.model_label(candidate), against: g.model_label(against)}
    if labels[candidate] == labels[against]:
        fail(f"the candidate and --against are the same model ({labels[candidate]})")
    try:
        computed = g.computed_as(device, dtype, template)
    except ModelError as e:
        fail(str(e))
    answers = {}
    for spec, label in labels.items():  # one model in memory at a time; a model answered before loads not
        engine = (
            engine_for(spec, device, None, template, dtype)
            if g.needs_answers(spec, files, out, limit, mode_list, computed)
            else None
        )

        def say(name: str, label: str = label) -> None:
            typer.echo(f"{label}: answering {name}", err=True)

        answers[spec] = g.answer_sets(engine, spec, files, out, limit, mode_list, not as_json, say, computed)
        del engine
    rows = []
    for name in names:
        try:
            rows += g.compare(name, answers[candidate][name], answers[against][name], mode_list, alpha)
        except ValueError as e:
            fail(str(e))
    cand, cur = labels[candidate], labels[against]
    if as_json:
        typer.echo(json.dumps(g.as_json(rows, cand, cur)))
    else:
        typer.echo(g.markdown(rows, cand, cur))
        verdict = (
            "PASSED"
            if g.passed(rows)
            else "FAILED: worse beyond noise on "
            + ", ".join(f"{r.set} ({r.mode})" for r in rows if r.verdict == "worse")
        )
        typer.echo(f"\ngate {verdict} (sign test at p < {alpha}; answers kept in {out})")
    if not g.passed(rows):
        raise typer.Exit(1)
