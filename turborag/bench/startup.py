"""`turborag bench cold-ask`: what a user waits for at the command line, cold and with a server running.

TTFT is what the engine spends; a person typing `turborag ask` also waits for the process to start, import
torch and load the model, the tokenizer and the embedder. Both are measured here on one store, in one run,
as wall clock of the real command in a new process:
- cold: `turborag ask --local` (loads everything itself), `repeats` times;
- server: a `turborag serve` of the same store is started (its start-up is not counted), then plain
  `turborag ask`, which finds it through the store's server file and asks it, `repeats` times.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

QUESTION = "What does the break statement do?"


def _ask(store: Path, *extra: str) -> tuple[float, dict]:
    """Wall clock of one `turborag ask --json` in a new process, and its JSON."""
    cmd = [sys.executable, "-m", "turborag", "ask", QUESTION, "--store", str(store), "--json", *extra]
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"`turborag ask` failed: {out.stderr.strip().splitlines()[-1:]}")
    return wall, json.loads(out.stdout.strip().splitlines()[-1])


def _start_server(store: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "turborag", "serve", "--store", str(store), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("`turborag serve` exited before it was ready")
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("`turborag serve` did not become ready in 300 s")


def bench_cold_ask(store: Path, repeats: int = 3, log=print) -> dict:
    cold = [_ask(store, "--local") for _ in range(repeats)]
    log(f"cold ask: {[round(w, 2) for w, _ in cold]} s")
    proc, url = _start_server(store)
    try:
        _ask(store)  # the server's first request warms it (allocator, kernels), like the local warm-up
        served = [_ask(store) for _ in range(repeats)]
    finally:
        proc.terminate()
        proc.wait(60)
    log(f"ask through {url}: {[round(w, 2) for w, _ in served]} s")
    cold_wall = statistics.median(w for w, _ in cold)
    served_wall = statistics.median(w for w, _ in served)
    served_ttft = statistics.median(j["ttft_s"] for _, j in served)
    return {
        "store": str(store),
        "repeats": repeats,
        "cold_wall_s": cold_wall,
        "cold_ttft_s": statistics.median(j["ttft_s"] for _, j in cold),
        "server_wall_s": served_wall,
        "server_ttft_s": served_ttft,
        "server_overhead_s": served_wall - served_ttft,
    }
