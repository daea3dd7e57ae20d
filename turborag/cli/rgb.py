"""`turborag data rgb`: the RGB benchmark's eval files, built from a user's own download of RGB's data.

RGB's text is CC BY-NC-SA 4.0 and is never shipped with turborag; this command only converts it (the work
is in eval/rgb.py).
"""

from __future__ import annotations

from pathlib import Path

import typer

from turborag.cli.common import fail


def rgb(
    rgb_json: Path = typer.Option(..., "--rgb-json", help="RGB's data/en.json, downloaded by you"),
    out: Path = typer.Option(..., "--out", help="folder for the eval files (pass it to gate --rgb-dir)"),
) -> None:
    """Build the RGB eval files (en5, en5_noise08, en_none and their _qshuf variants) from RGB's en.json.

    Get en.json from RGB (Chen et al., AAAI 2024; licence CC BY-NC-SA 4.0, non-commercial):
    curl -LO https://raw.githubusercontent.com/chen700564/RGB/master/data/en.json

    For evaluation only: never train or tune on these files.
    """
    from turborag.eval.rgb import RgbFormatError, build, load_rows

    if not rgb_json.is_file():
        fail(
            f"no file {rgb_json}; download RGB's en.json with: "
            "curl -LO https://raw.githubusercontent.com/chen700564/RGB/master/data/en.json"
        )
    try:
        rows = load_rows(rgb_json)
    except RgbFormatError as e:
        fail(f"{rgb_json}: {e}")
    except UnicodeDecodeError:
        fail(f"{rgb_json}: not UTF-8 text (is this RGB's data/en.json?)")
    try:
        report = build(rows, out)
    except OSError as e:
        fail(f"cannot write to {out}: {e}")
    for name, n in report.written.items():
        typer.echo(f"wrote {n} questions to {out / name}", err=True)
    typer.echo(
        f"questions left out: {report.skipped_multipart} needing several answers at once (every file); "
        f"from en_none, {report.skipped_leaking} whose negatives name the answer and "
        f"{report.skipped_no_negatives} with no negative",
        err=True,
    )
