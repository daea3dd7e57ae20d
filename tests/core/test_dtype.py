"""`--dtype`: auto picks bf16 only where the hardware multiplies it, and a store keeps its dtype."""

from __future__ import annotations

import pytest
import torch

from turborag.core import files as files_mod
from turborag.core import model as model_mod
from turborag.core.model import ModelError, cache_format_for, resolve_dtype

CPU = torch.device("cpu")


@pytest.mark.parametrize("has_bf16, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_follows_the_cpu_flags(monkeypatch, has_bf16, expected):
    monkeypatch.setattr(model_mod, "cpu_has_bf16", lambda: has_bf16)
    assert resolve_dtype("auto", CPU) == expected
    assert resolve_dtype(None, CPU) == expected


def test_explicit_names_and_bad_ones():
    assert resolve_dtype("float32", CPU) == torch.float32
    assert resolve_dtype("bfloat16", CPU) == torch.bfloat16
    assert resolve_dtype(torch.float16, CPU) == torch.float16
    with pytest.raises(ModelError, match="unknown dtype 'fp8'.*auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", CPU)


@pytest.mark.parametrize("has_bf16", [True, False])
def test_explicit_bf16_on_a_cpu_that_emulates_it_warns(monkeypatch, caplog, has_bf16):
    monkeypatch.setattr(model_mod, "cpu_has_bf16", lambda: has_bf16)
    with caplog.at_level("WARNING", logger="turborag.core.model"):
        assert resolve_dtype("bfloat16", CPU) == torch.bfloat16
        assert resolve_dtype("float32", CPU) == torch.float32
    warned = [r for r in caplog.records if "emulated" in r.getMessage()]
    assert len(warned) == (0 if has_bf16 else 1)


@pytest.mark.parametrize(
    "flags, expected",
    [
        ("fpu sse avx512f amx_bf16 amx_tile", True),
        ("fpu avx512f avx512_bf16", True),
        ("fpu avx2 avx512f", False),
    ],
)
def test_cpu_flags_are_read_not_assumed(tmp_path, flags, expected):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\nbugs\t\t: spectre\n")
    assert model_mod.cpu_has_bf16(str(info)) == expected


def test_caches_are_kept_in_the_compute_dtype_when_it_is_16_bit():
    assert cache_format_for(torch.bfloat16) == "bfloat16"
    assert cache_format_for(torch.float16) == "float16"
    assert cache_format_for(torch.float32) == "float16"


def test_file_digests_are_remembered_until_the_file_changes(tmp_path, monkeypatch):
    import hashlib

    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    f = tmp_path / "model.gguf"
    f.write_bytes(b"weights v1")
    calls = []
    real = files_mod.sha256_file
    monkeypatch.setattr(files_mod, "sha256_file", lambda p: calls.append(p) or real(p))
    assert files_mod.file_digest(f) == hashlib.sha256(b"weights v1").hexdigest()
    assert files_mod.file_digest(f) == hashlib.sha256(b"weights v1").hexdigest() and len(calls) == 1
    f.write_bytes(b"weights v2, longer")  # another size (and mtime): hashed again
    assert files_mod.file_digest(f) == hashlib.sha256(b"weights v2, longer").hexdigest() and len(calls) == 2
