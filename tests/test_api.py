"""The public API: the top-level names, and the README's Python example run as written on a tiny model."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import write_corpus

import turborag

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    """The first python block of the README's "Python API" section."""
    section = README.read_text().split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_public_names_resolve_from_their_layers():
    for name in turborag.__all__:
        obj = getattr(turborag, name)
        assert obj is not None
        module = getattr(obj, "__module__", None)
        assert module is None or module.startswith(("turborag.store.", "turborag.core.", "turborag.rag."))
    with pytest.raises(AttributeError):
        turborag.NoSuchThing  # noqa: B018


def test_import_turborag_is_cheap():
    """`import turborag` loads no layer (and no torch): names load on first use."""
    code = "import sys, turborag; print([m for m in sys.modules if m.startswith(('torch', 'turborag.'))])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_readme_example_ingests_and_answers_in_turbo(tmp_path, tiny_model_dir):
    code = readme_example()
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    for literal in ('"gemma-3-270m-turbo"', '"my-store"', '"docs/"'):
        assert literal in code, f"the README example no longer uses {literal}"
    code = (
        code.replace('"gemma-3-270m-turbo"', repr(tiny_model_dir))
        .replace('"my-store"', repr(str(tmp_path / "store")))
        .replace('"docs/"', repr(str(write_corpus(tmp_path / "docs"))))
    )
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), namespace)
    answer = namespace["answer"]
    assert len(namespace["passages"]) == 5
    assert answer.mode == "turbo" and answer.cached_tokens > 0 and answer.completion_tokens > 0
    assert "TTFT" in printed.getvalue()
    assert len(list((tmp_path / "store" / "kv").glob("*/*.safetensors"))) >= 10  # one cache per document
