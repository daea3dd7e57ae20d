"""`turborag ask` through a running `turborag serve`: the server file in the store, and a small SSE client.

A cold `ask` pays for importing torch and loading the model, the tokenizer and the embedder (seconds) before
a TTFT of a tenth of a second; a server has all of that resident. So `turborag serve --store DIR` writes
`DIR/server.json` (its URL and pid) while it runs, and `ask` on the same store sends the question there when
the file names a live process, costing one request instead of a process start. Only the standard library
is used here, so this path never imports torch.

A server that is running but busy (a long queue, long generations) is not a missing one: once it has taken
the connection, `ask_server` waits for the answer to start as long as it takes, saying so every
`WAIT_REPORT_S` seconds, or until the caller's time limit (`ServerBusy`). Only a server that cannot be
reached at all (`ServerUnreachable`: connection refused) lets `ask` answer locally; doing so behind a busy
server's back would load a second model and compute the same answer twice.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

SERVER_FILE = "server.json"
CONNECT_TIMEOUT_S = 10.0  # a server that takes no connection in this long is not there
WAIT_REPORT_S = 15.0  # seconds between two "waiting for the server" lines while a busy server queues us


def local_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for a server bound to host:port."""
    if host in ("0.0.0.0", "::", "", "localhost"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def write_server_file(store: Path, url: str, model: str, api_key: bool) -> Path:
    """Announce a server in its store (atomically); `remove_server_file` takes it back on shutdown."""
    path = Path(store) / SERVER_FILE
    tmp = path.with_name(f".{SERVER_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "model": model, "api_key": api_key}))
    os.replace(tmp, path)
    return path


def remove_server_file(store: Path) -> None:
    """Remove the server file if it is this process's (another server may have taken the store over)."""
    path = Path(store) / SERVER_FILE
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def find_server(store: Path) -> str | None:
    """The URL of a server running on this store, or None. A file left by a server that died (kill -9) is
    ignored: its pid is not alive."""
    try:
        info = json.loads((Path(store) / SERVER_FILE).read_text())
        os.kill(int(info["pid"]), 0)  # signal 0: does the process exist?
        return str(info["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ServerUnreachable(Exception):
    """No server took the connection at the URL (refused, timed out): the caller may answer locally."""


class ServerError(Exception):
    """The server answered with an error (the message is the server's own, OpenAI error shape), or dropped
    the request it had taken."""


class ServerBusy(Exception):
    """The server took the request but did not start answering within the caller's time limit."""


@dataclass
class RemoteAnswer:
    text: str = ""
    mode: str = ""
    ttft_s: float = 0.0  # the server's TTFT (its engine's, as `ask` reports locally)
    total_s: float = 0.0  # wall clock of the request, as this client saw it
    prompt_tokens: int = 0
    cached_tokens: int = 0
    chunks: list[str] = field(default_factory=list)


def ask_server(
    url: str,
    question: str,
    mode: str,
    top_k: int,
    max_tokens: int,
    api_key: str | None = None,
    collection: str = "default",
    wait_s: float | None = None,
    notify: Callable[[str], None] | None = None,
) -> Iterator[str | RemoteAnswer]:
    """Stream the answer from `url`: text deltas as they arrive, then one RemoteAnswer. A busy server is
    waited for (`notify` gets a progress line now and then) until `wait_s` seconds pass, if given."""
    body = {
        "model": "turborag",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "turborag": {"mode": mode, "top_k": top_k, "collection": collection},
    }
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    t0 = time.perf_counter()
    resp = _post(url, "/v1/chat/completions", json.dumps(body).encode(), headers, wait_s, notify)
    if resp.status >= 400:
        raise ServerError(_error_message(resp))
    answer = RemoteAnswer()
    with resp:
        try:
            for raw in resp:  # server-sent events: "data: {...}" lines
                yield from _read_event(raw, answer, mode)
        except (OSError, http.client.HTTPException) as e:
            raise ServerError(f"the server at {url} stopped answering ({e})") from None
    answer.total_s = time.perf_counter() - t0
    yield answer


def _read_event(raw: bytes, answer: RemoteAnswer, mode: str) -> list[str]:
    """One server-sent event line folded into `answer`; returns its text deltas. An error event (the server
    stopped mid-answer, e.g. shutting down) raises ServerError."""
    line = raw.decode("utf-8").strip()
    if not line.startswith("data: ") or line == "data: [DONE]":
        return []
    event = json.loads(line[len("data: ") :])
    if "error" in event:
        raise ServerError(f"server: {(event['error'] or {}).get('message', 'error')}")
    texts = [t for c in event.get("choices", []) if (t := (c.get("delta") or {}).get("content"))]
    answer.text += "".join(texts)
    extra = event.get("turborag")
    if extra:
        answer.mode, answer.ttft_s = extra.get("mode", mode), extra.get("ttft_s", 0.0)
        answer.chunks = [_chunk_name(c) for c in extra.get("chunks", [])]
    usage = event.get("usage")
    if usage:
        answer.prompt_tokens = usage.get("prompt_tokens", 0)
        answer.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return texts


def _post(
    url: str,
    path: str,
    body: bytes,
    headers: dict,
    wait_s: float | None,
    notify: Callable[[str], None] | None,
) -> http.client.HTTPResponse:
    """Send the request and return the response once it starts. Failing to connect is ServerUnreachable;
    once connected, the server has the request, so no read timeout applies: a slow answer is a busy server."""
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "127.0.0.1", parts.port, timeout=CONNECT_TIMEOUT_S)
    try:
        conn.connect()
    except OSError as e:
        raise ServerUnreachable(f"no server answers at {url} ({e.strerror or e})") from None
    conn.sock.settimeout(None)
    try:
        conn.request("POST", parts.path.rstrip("/") + path, body, headers)
    except OSError as e:
        raise ServerError(f"the server at {url} dropped the request ({e})") from None
    return _await_response(conn, url, wait_s, notify)


def _await_response(
    conn: http.client.HTTPConnection,
    url: str,
    wait_s: float | None,
    notify: Callable[[str], None] | None,
) -> http.client.HTTPResponse:
    """The response of a sent request, read on a thread so that this one can report the wait (a server
    answers once the model has begun the request, after the requests queued before it) and give up at
    `wait_s`, closing the connection so that the server drops the request too."""
    got: dict = {}
    done = threading.Event()

    def receive() -> None:
        try:
            got["response"] = conn.getresponse()
        except BaseException as e:  # handed to the caller's thread
            got["error"] = e
        finally:
            done.set()

    threading.Thread(target=receive, name="turborag-ask", daemon=True).start()
    t0, limit, report_at = time.monotonic(), math.inf if wait_s is None else wait_s, WAIT_REPORT_S
    while not done.wait(max(0.0, min(report_at, limit) - (time.monotonic() - t0))):
        waited = time.monotonic() - t0
        if waited >= limit:
            _abort(conn)
            raise _busy(url, waited)
        if waited >= report_at:
            if notify is not None:
                queued = _queue_depth(url)
                busy = "" if queued is None else f" (busy: {queued} queued)"
                notify(f"waiting for the server at {url}{busy} ... {waited:.0f} s")
            report_at += WAIT_REPORT_S
    if "error" in got:
        raise ServerError(f"the server at {url} closed the connection without an answer ({got['error']})")
    return got["response"]


def _busy(url: str, waited: float) -> ServerBusy:
    queued = _queue_depth(url)
    return ServerBusy(
        f"the server at {url} is busy{'' if queued is None else f' ({queued} queued)'}: its answer had not "
        f"started after {waited:.0f} s; ask again later, with a longer --timeout, or with --local to answer "
        "here"
    )


def _queue_depth(url: str) -> int | None:
    """The requests waiting or running on the server (its /health), or None if it does not say quickly."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return int(json.loads(resp.read())["queue_depth"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _abort(conn: http.client.HTTPConnection) -> None:
    """Close a connection another thread is reading from (close alone would not wake it)."""
    try:
        conn.sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError):
        pass
    conn.close()


def _chunk_name(chunk) -> str:
    """`name#ordinal` of a chunk as the server names it (`{"name", "ordinal", ...}`)."""
    if isinstance(chunk, dict):
        return f"{chunk.get('name', chunk.get('document', '?'))}#{chunk.get('ordinal', 0)}"
    return str(chunk)


def _error_message(resp: http.client.HTTPResponse) -> str:
    try:
        return f"server {resp.status}: {json.loads(resp.read())['error']['message']}"
    except (ValueError, KeyError, TypeError, OSError, http.client.HTTPException):
        return f"server {resp.status}: {resp.reason}"
