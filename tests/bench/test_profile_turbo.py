"""scripts/profile_turbo.py (turborag_research/notes/2026-12-06-ttft-floor.md cites it): the phases of one
turbo request and the floor's distance
from the compute limit, on a tiny Gemma 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "profile_turbo.py"


def test_attention_flops_count_each_layers_keys():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from profile_turbo import attention_flops
    finally:
        sys.path.remove(str(SCRIPT.parent))
    config = SimpleNamespace(num_attention_heads=2, head_dim=8, hidden_size=64)
    # a sliding layer sees its window of 4 keys, a global one all 10: 4 * heads * head_dim * queries * keys
    assert attention_flops(config, [4, None], queries=3, keys=10) == 4 * 2 * 8 * 3 * (4 + 10)
    assert attention_flops(config, [None], queries=3, keys=2) == 4 * 2 * 8 * 3 * 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_profile_on_a_tiny_model(tiny_model_dir, env, dtype):
    from turborag.core.model import cpu_has_bf16

    if dtype == "bfloat16" and not cpu_has_bf16():
        # The script measures the CPU's matmul rate in the dtype: emulated bf16 (no AVX512-BF16 or AMX) runs
        # it at ~0.3 GFLOP/s, over the time limit; --dtype auto never picks bf16 on such a CPU.
        pytest.skip("bf16 is emulated on this CPU")
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", tiny_model_dir, "--context-tokens", "600", "--repeats", "2"]
        + ["--dtype", dtype, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TURBORAG_HOME": str(env / "home")},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    phases, limit = out["phases_s"], out["compute_limit"]
    assert out["chunks"] >= 2 and out["context_tokens"] >= 500
    assert out["read_in_place"] == (dtype == "bfloat16")  # a bf16 store is read straight into the buffers
    assert all(v > 0 for k, v in phases.items())
    parts = sum(phases[k] for k in ("prompt + keys", "read", "assemble", "question prefill", "first token"))
    assert abs(parts - phases["total"]) < 0.5 * phases["total"]  # medians of parts, near the total's
    assert 0 < limit["attention_gflop"] < limit["gflop"] and limit["matmul_gflops"] > 0
    assert limit["compute_bound_s"] == limit["gflop"] / limit["matmul_gflops"]
