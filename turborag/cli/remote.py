"""`turborag ask` through a running `turborag serve`: the server file in the store, and a small SSE client.

A cold `ask` pays for importing torch and loading the model, the tokenizer and the embedder (seconds) before
a TTFT of a tenth of a second; a server has all of that resident. So `turborag serve --store DIR` writes
`DIR/server.json` (its URL and pid) while it runs, and `ask` on the same store sends the question there when
the file names a live process, costing one request instead of a process start. Only the standard library
is used here, so this path never imports torch.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SERVER_FILE = "server.json"


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
    """No server answered at the URL (connection refused, timed out): the caller may answer locally."""


class ServerError(Exception):
    """The server answered with an error; the message is the server's own (OpenAI error shape)."""


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
) -> Iterator[str | RemoteAnswer]:
    """Stream the answer from `url`: text deltas as they arrive, then one RemoteAnswer."""
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
    req = urllib.request.Request(
        f"{url}/v1/chat/completions", json.dumps(body).encode(), headers=headers, method="POST"
    )
    t0 = time.perf_counter()
    try:
        resp = urllib.request.urlopen(req, timeout=600)
    except urllib.error.HTTPError as e:
        raise ServerError(_error_message(e)) from None
    except (urllib.error.URLError, OSError) as e:
        raise ServerUnreachable(f"no server answers at {url} ({getattr(e, 'reason', e)})") from None
    answer = RemoteAnswer()
    with resp:
        for raw in resp:  # server-sent events: "data: {...}" lines
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            for choice in event.get("choices", []):
                text = (choice.get("delta") or {}).get("content")
                if text:
                    answer.text += text
                    yield text
            extra = event.get("turborag")
            if extra:
                answer.mode, answer.ttft_s = extra.get("mode", mode), extra.get("ttft_s", 0.0)
                answer.chunks = [_chunk_name(c) for c in extra.get("chunks", [])]
            usage = event.get("usage")
            if usage:
                answer.prompt_tokens = usage.get("prompt_tokens", 0)
                answer.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    answer.total_s = time.perf_counter() - t0
    yield answer


def _chunk_name(chunk) -> str:
    """`name#ordinal` of a chunk as the server names it (`{"name", "ordinal", ...}`)."""
    if isinstance(chunk, dict):
        return f"{chunk.get('name', chunk.get('document', '?'))}#{chunk.get('ordinal', 0)}"
    return str(chunk)


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        return f"server {e.code}: {json.loads(e.read())['error']['message']}"
    except (ValueError, KeyError, TypeError, OSError):
        return f"server {e.code}: {e.reason}"
