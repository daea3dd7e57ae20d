"""`turborag ask` and a running server that is slow to answer: a busy server is not a missing one. `ask`
waits and says so, or gives up with one line at `--timeout`; it never loads a model to answer a second time
(it used to, after 10 minutes, without a word)."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from turborag.cli import app, remote
from turborag.cli import ask as ask_cmd
from turborag.cli.remote import SERVER_FILE

runner = CliRunner()
EVENTS = [
    {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
    {"choices": [{"delta": {"content": "Odrun Pask."}}]},
    {"choices": [{"delta": {}, "finish_reason": "stop"}], "turborag": {"mode": "turbo", "ttft_s": 0.01}},
    {"choices": [], "usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 30}}},
]


class SlowServer(ThreadingHTTPServer):
    """Answers /health at once (3 requests queued) and a question only after `delay` seconds, or drops the
    connection without an answer (`drop`), as a server does that a queue of long generations keeps busy."""

    daemon_threads = True

    def __init__(self, delay: float, drop: bool = False):
        super().__init__(("127.0.0.1", 0), Handler)
        self.delay, self.drop, self.asked = delay, drop, 0
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: SlowServer

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._send(200, "application/json", json.dumps({"status": "ok", "queue_depth": 3}).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.asked += 1
        time.sleep(self.server.delay)
        if self.server.drop:
            return  # the connection closes with no answer
        body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in EVENTS) + b"data: [DONE]\n\n"
        try:
            self._send(200, "text/event-stream", body)
        except OSError:  # the client gave up
            pass

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def slow_server(request, tmp_path, monkeypatch):
    """A store whose server.json names a live process (this one) and the slow server; answering locally
    fails the test."""
    delay, drop = request.param
    srv = SlowServer(delay, drop)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    store = tmp_path / "store"
    store.mkdir()
    (store / SERVER_FILE).write_text(json.dumps({"url": srv.url, "pid": os.getpid()}))
    monkeypatch.setattr(remote, "WAIT_REPORT_S", 0.3)

    def no_local_answer(*args, **kwargs):
        raise AssertionError("ask loaded a model although a live server had the question")

    monkeypatch.setattr(ask_cmd, "open_catalog", no_local_answer)
    monkeypatch.setattr(ask_cmd, "load_engine", no_local_answer)
    yield srv, store
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("slow_server", [(1.5, False)], indirect=True)
def test_ask_waits_for_a_busy_server_and_says_so(slow_server):
    srv, store = slow_server
    r = runner.invoke(app, ["ask", "Who rings the bell?", "--store", str(store)])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("Odrun Pask.") and srv.asked == 1
    waiting = [line for line in r.stderr.splitlines() if line.startswith("waiting")]
    assert waiting and waiting[0].startswith(f"waiting for the server at {srv.url} (busy: 3 queued) ... ")
    assert waiting[-1].endswith(" s") and "answering here" not in r.stderr
    assert f"[turbo via {srv.url}]" in r.stderr


@pytest.mark.parametrize("slow_server", [(10, False)], indirect=True)
def test_with_a_time_limit_a_busy_server_is_one_line_and_exit_1(slow_server):
    srv, store = slow_server
    t0 = time.monotonic()
    r = runner.invoke(app, ["ask", "Who rings the bell?", "--store", str(store), "--timeout", "0.5"])
    assert time.monotonic() - t0 < 5 and r.exit_code == 1, r.output
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: the server at {srv.url} is busy (3 queued): its answer had not started")
    assert "--local" in last and "answering here" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("slow_server", [(0.2, True)], indirect=True)
def test_a_server_that_drops_the_question_is_an_error_not_a_local_answer(slow_server):
    srv, store = slow_server
    r = runner.invoke(app, ["ask", "Who rings the bell?", "--store", str(store)])
    assert r.exit_code == 2 and srv.asked == 1, r.output
    assert f"error: the server at {srv.url} closed the connection without an answer" in r.stderr
