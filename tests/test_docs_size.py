"""The user's docs stay short: the README is what it is and how to start, BENCHMARKS today's numbers only;
history goes to turborag_research/notes/. The limits are the ones the docs were cut to."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIMITS = {"README.md": 200, "docs/BENCHMARKS.md": 400}


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_doc_within_its_line_limit(name):
    lines = (REPO / name).read_text(encoding="utf-8").count("\n")
    assert lines <= LIMITS[name], f"{name} has {lines} lines (at most {LIMITS[name]}): move history to notes"
