"""SIGTERM stops a busy server in seconds: new work is refused with 503, running generations end at their
next decode step with an error, `server.json` goes, and the process exits (it used to wait ~90 s for a long
generation to finish)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from helpers import write_corpus
from typer.testing import CliRunner

from turborag.cli import app
from turborag.cli.remote import SERVER_FILE
from turborag.serve.state import shutting_down
from turborag.serve.worker import Generation, ModelWorker, ShuttingDown

LONG = 4000  # tokens: a generation of many seconds on the tiny model


class EndlessSeq:
    """A sequence that never finishes by itself."""

    prompt_tokens, cached_tokens, finished = 4, 0, False

    def advance(self) -> list:
        return ["t"]


def test_stop_ends_running_and_queued_jobs_at_the_next_step_and_refuses_new_ones():
    async def main():
        worker = ModelWorker(max_queue=8, step=lambda rows: time.sleep(0.001), max_batch=1)
        running = worker.submit(Generation(EndlessSeq))
        queued = worker.submit(Generation(EndlessSeq))  # max_batch 1: waits behind the first
        items = running.items()
        assert await items.__anext__() == "t"  # decoding
        worker.stop()
        with pytest.raises(ShuttingDown):
            worker.submit(Generation(EndlessSeq))
        t0 = time.monotonic()
        with pytest.raises(ShuttingDown):
            async for _ in items:
                pass
        with pytest.raises(ShuttingDown):
            async for _ in queued.items():
                pass
        return time.monotonic() - t0

    assert asyncio.run(main()) < 2
    err = shutting_down(ShuttingDown())
    assert err.status == 503 and err.code == "shutting_down" and err.headers == {"Retry-After": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _long_generation(url: str, seen: list[str], started: threading.Event) -> None:
    """A streamed completion of 4000 tokens (minimum too: no early end), its events collected as they come."""
    body = {"model": "turborag", "prompt": "The harbour", "stream": True}
    body |= {"max_tokens": LONG, "min_tokens": LONG}
    req = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            for raw in resp:
                if raw.startswith(b"data: "):
                    seen.append(raw.decode().strip())
                    started.set()
    except OSError as e:
        seen.append(f"closed: {e}")
    finally:
        started.set()


def test_sigterm_stops_a_busy_server_within_seconds(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    store = tmp_path / "store"
    docs = write_corpus(tmp_path / "docs")
    r = CliRunner().invoke(app, ["ingest", str(docs), "--store", str(store), "--model", tiny_model_dir])
    assert r.exit_code == 0, r.output
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "turborag", "serve", "--store", str(store), "--port", str(port)]
    proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while (store / SERVER_FILE).exists() is False or not _healthy(url):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()
            time.sleep(0.2)
        seen: list[str] = []
        started = threading.Event()
        client = threading.Thread(target=_long_generation, args=(url, seen, started), daemon=True)
        client.start()
        assert started.wait(60) and seen and seen[0].startswith("data: {"), seen  # generating

        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        refused = _post_during_shutdown(url)
        proc.wait(5)
        assert time.monotonic() - t0 < 5
        assert proc.returncode == 0, proc.stderr.read().decode()
        assert not (store / SERVER_FILE).exists()
        client.join(5)
        assert any("shutting_down" in e for e in seen), seen[-3:]  # the stream says why it ended
        assert not any('"finish_reason": "length"' in e for e in seen)  # it did not run to its end
        assert refused in ("refused", "503 shutting_down"), refused
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _healthy(url: str) -> bool:
    try:
        urllib.request.urlopen(f"{url}/health", timeout=1)
        return True
    except OSError:
        return False


def _post_during_shutdown(url: str) -> str:
    """A new request right after SIGTERM: a 503 while the server drains, or no connection at all."""
    body = json.dumps({"model": "turborag", "prompt": "x", "max_tokens": 2}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return f"{resp.status}"
    except urllib.error.HTTPError as e:
        return f"{e.code} {json.loads(e.read())['error']['code']}"
    except OSError:  # refused, or closed by the stopping server before an answer
        return "refused"
