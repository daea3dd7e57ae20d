"""`turborag demo`: the bundled corpus answered in full and turbo mode (the work is in bench/demo.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from turborag.cli.common import DeviceOpt, DtypeOpt, ModelOpt, TemplateOpt, stdout
from turborag.cli.loading import engine_for
from turborag.core.defaults import turborag_home


def demo(
    model: str = ModelOpt,
    device: str = DeviceOpt,
    template: str = TemplateOpt,
    dtype: str = DtypeOpt,
    store: Path = typer.Option(None, help="cache store directory (default: $TURBORAG_HOME/demo-store)"),
) -> None:
    """Answer bundled questions over bundled passages in full and turbo mode; print answers and TTFT."""
    from turborag.bench.demo import run_demo

    engine = engine_for(model, device, store or turborag_home() / "demo-store", template, dtype)
    run_demo(engine, stdout(), remake_stale=store is None)  # the default store is the demo's own
