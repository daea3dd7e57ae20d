"""`turborag ask` through a running `turborag serve` of the same store (found through DIR/server.json)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers import write_corpus
from typer.testing import CliRunner

from turborag.cli import app
from turborag.cli.remote import SERVER_FILE, find_server
from turborag.core.prompt import ABSTAIN

runner = CliRunner()
QUESTION = "Who rings the bell at the harbour?"


@pytest.fixture
def store(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    docs = write_corpus(tmp_path / "docs")
    root = tmp_path / "store"
    r = runner.invoke(app, ["ingest", str(docs), "--store", str(root), "--model", tiny_model_dir, "--json"])
    assert r.exit_code == 0, r.output
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(store, request):
    port = _free_port()
    env = {**os.environ, "TURBORAG_HOME": str(store.parent / "home")}
    cmd = [sys.executable, "-m", "turborag", "serve", "--store", str(store), "--port", str(port)]
    cmd += getattr(request, "param", [])  # more serve options
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.2)
    yield url, proc
    proc.terminate()
    proc.wait(30)


def test_ask_finds_the_running_server_and_answers_through_it(store, server):
    url, proc = server
    info = json.loads((store / SERVER_FILE).read_text())
    assert info["url"] == url and info["pid"] == proc.pid and find_server(store) == url
    r = runner.invoke(app, ["ask", QUESTION, "--store", str(store), "--max-new-tokens", "3"])
    assert r.exit_code == 0, r.output
    # auto, resolved by the server: the tiny model has no cache-aware fine-tune
    assert f"[turbo-blend via {url}] TTFT" in r.stderr and "passages: harbour.md#" in r.stderr
    out = json.loads(runner.invoke(app, ["ask", QUESTION, "--store", str(store), "--json"]).stdout)
    assert set(out) == {"answer", "mode", "ttft_s", "total_s", "prompt_tokens", "cached_tokens", "chunks"}
    assert (
        out["mode"] == "turbo-blend"
        and out["cached_tokens"] > 0
        and out["chunks"][0].split("#")[0].endswith("harbour.md")
    )
    local = runner.invoke(app, ["ask", QUESTION, "--store", str(store), "--local", "--max-new-tokens", "3"])
    assert local.exit_code == 0 and "via" not in local.stderr
    proc.terminate()
    proc.wait(30)
    assert not (store / SERVER_FILE).exists()  # taken back on shutdown


def test_a_dead_server_file_is_ignored_and_a_wrong_url_is_one_line(store):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (store / SERVER_FILE).write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": dead.pid}))
    assert find_server(store) is None
    r = runner.invoke(app, ["ask", QUESTION, "--store", str(store), "--max-new-tokens", "2"])
    assert r.exit_code == 0 and "via" not in r.stderr and "warning" not in r.stderr
    port = _free_port()
    r = runner.invoke(app, ["ask", QUESTION, "--server", f"http://127.0.0.1:{port}"])
    assert r.exit_code == 2 and "no server answers at" in r.stderr and "Traceback" not in r.output


def test_asking_through_the_server_imports_no_torch(store, server):
    """The point of asking a server: no model, and not even torch, in the asking process."""
    url, _ = server
    code = (
        "import sys\nfrom turborag.cli import main\nsys.argv = ['turborag', 'ask', 'Who rings the bell?', "
        f"'--store', {str(store)!r}, '--max-new-tokens', '2']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('TORCH', 'torch' in sys.modules, file=sys.stderr)\n"
    )
    env = {**os.environ, "TURBORAG_HOME": str(store.parent / "home")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert f"via {url}" in out.stderr and "TORCH False" in out.stderr, out.stderr


@pytest.mark.parametrize("server", [["--abstain-threshold", "1e-300"]], indirect=True)
def test_served_abstain_threshold_applies_to_asks_through_the_server(store, server):
    """A threshold every probability reaches: the answer through the server is the abstention reply."""
    url, proc = server
    out = runner.invoke(app, ["ask", QUESTION, "--store", str(store), "--json", "--max-new-tokens", "40"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["answer"] == ABSTAIN
    proc.terminate()
    proc.wait(30)
    assert "p >= 1e-300" in proc.stderr.read().decode()  # the startup note says so
