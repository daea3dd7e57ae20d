"""The fast tokenizer path is taken only for a tokenizer shown to behave like the folder's own class."""

from __future__ import annotations

import json

import pytest
import transformers

from tests.conftest import char_tokenizer
from turborag.core import tokenizer as tk
from turborag.core.files import index_path


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    out = tmp_path / "tok"
    char_tokenizer().save_pretrained(out)
    return out


@pytest.fixture
def slow_loads(monkeypatch):
    """Counts AutoTokenizer loads (the slow, always-correct path)."""
    calls = []
    real = transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(
        transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: calls.append(a) or real(*a, **k)
    )
    return calls


def test_checked_once_then_loaded_fast_and_identical(folder, slow_loads):
    first = tk.load_tokenizer(folder)
    assert len(slow_loads) == 1
    verdicts = tk.read_index(tk.VERDICTS)
    assert [v["fast"] for v in verdicts.values()] == [True]
    second = tk.load_tokenizer(folder)
    assert len(slow_loads) == 1  # the verdict is remembered: no slow load again
    assert tk._behaviour(second) == tk._behaviour(first)
    assert second("Passage: a b\n")["input_ids"] == first("Passage: a b\n")["input_ids"]


def test_a_tokenizer_that_differs_keeps_the_slow_path(folder, slow_loads, monkeypatch):
    real_fast = tk._fast

    def different(path, attrs):
        tok = real_fast(path, attrs)
        tok.model_max_length = 7  # any difference in behaviour
        return tok

    monkeypatch.setattr(tk, "_fast", different)
    tk.load_tokenizer(folder)
    assert [v["fast"] for v in tk.read_index(tk.VERDICTS).values()] == [False]
    tk.load_tokenizer(folder)
    assert len(slow_loads) == 2  # still the slow path, and not checked again


def test_a_changed_tokenizer_is_checked_again(folder, slow_loads):
    tk.load_tokenizer(folder)
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": 123}))
    tok = tk.load_tokenizer(folder)
    assert len(slow_loads) == 2 and len(tk.read_index(tk.VERDICTS)) == 2
    assert tk.load_tokenizer(folder).model_max_length == tok.model_max_length == 123


def test_a_damaged_verdict_file_is_rebuilt(folder, slow_loads):
    path = index_path(tk.VERDICTS)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    tk.load_tokenizer(folder)
    assert [v["fast"] for v in tk.read_index(tk.VERDICTS).values()] == [True]


@pytest.mark.real_model
def test_the_default_models_fast_tokenizer_is_its_own(tmp_path, monkeypatch):
    """Gemma 3's 262k-token tokenizer: the fast path behaves exactly like GemmaTokenizer."""
    from turborag.core.model import default_model_dir

    folder = default_model_dir()
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))  # a fresh verdict file
    slow = tk.load_tokenizer(folder)
    assert type(slow).__name__ == "GemmaTokenizer"
    fast = tk.load_tokenizer(folder)
    assert type(fast).__name__ != "GemmaTokenizer"
    assert tk._behaviour(fast) == tk._behaviour(slow)


@pytest.mark.real_model
def test_the_default_model_converted_from_gguf_tokenizes_as_gemma_3():
    """Gemma 3's ids for a plain sentence (BOS, then one token a word). transformers 5.17-5.22 converted the
    GGUF's tokenizer wrongly (no BOS, other ids: the model then answered nonsense with correct weights),
    hence transformers>=5.23 in pyproject.toml."""
    from turborag.core.model import default_model_dir

    tok = tk.load_tokenizer(default_model_dir())
    ids = tok("The break statement ends the loop.")["input_ids"]
    assert ids == [2, 818, 2541, 5456, 10842, 506, 7350, 236761]
    assert [tok.decode([i]) for i in ids[1:4]] == ["The", " break", " statement"]
