"""The server's browser-facing hardening (issue 38), each finding reproduced against a server on a tiny model:

1. CSRF and DNS rebinding on a server without keys: a JSON body sent as text/plain (415), a form posted from
   another local origin (403), a foreign Host header (421, in-process and through a real `turborag serve`).
2. Security headers on every response, and the page's CSP, which its static files do not break.
3. `/metrics` labels by route template, so unauthenticated requests to made-up names add no series.
4. A 503 for an unreachable shared store names no host, port or URL (the log keeps them).
5. Malformed content parts and lone surrogates are 400s, not 500s.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from importlib import resources

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers import write_corpus
from typer.testing import CliRunner

from turborag.cli import app as cli
from turborag.cli.serve import served_for
from turborag.serve import Served, create_app
from turborag.serve.origin import CSP, HostPolicy
from turborag.store.errors import StoreUnavailable

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
BASE = "http://127.0.0.1:8000"  # what the in-process apps believe they are bound to
OWN = {"Origin": BASE}
ELSEWHERE = {"Origin": "http://localhost:3000"}  # another local dev server: same site, other origin
JSON_TEXT = {"Content-Type": "text/plain"}


def _error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code, err
    return err


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory, tiny_model_dir):
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("TURBORAG_HOME", str(home))
    docs = write_corpus(home / "docs")
    store = home / "store"
    args = ["ingest", str(docs), "--store", str(store), "--model", tiny_model_dir, "--chunk-tokens", "64"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    yield store
    mp.undo()


@pytest.fixture(scope="module")
def backend(store_dir):
    return served_for(store_dir, None, "cpu", 2)


@pytest.fixture(scope="module")
def open_server(backend):
    """A server as `turborag serve` makes it by default: no keys, bound to 127.0.0.1:8000."""
    the_app = create_app(backend, hosts=HostPolicy.for_bind("127.0.0.1", 8000))
    with TestClient(the_app, base_url=BASE) as client:
        yield client


@pytest.fixture(scope="module")
def keyed(backend):
    """A keyed server without a store (the store's engine, served bare)."""
    bare = Served(backend.engine, "tiny", default_max_tokens=2)
    with TestClient(create_app(bare, api_key=KEY, max_body_bytes=100_000), base_url=BASE) as client:
        yield client


def _doc_names(client: TestClient) -> set[str]:
    return {d["name"] for d in client.get("/v1/documents").json()["data"]}


# -- 1. Content-Type, Origin, Host ------------------------------------------------------------------


def test_json_body_sent_as_text_plain_is_415(open_server):
    before = _doc_names(open_server)
    cases = [
        ("/v1/collections", {"name": "planted"}),
        ("/v1/documents", {"name": "planted.txt", "text": "Planted text."}),
        ("/v1/chat/completions", {"model": "turborag", "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"model": "turborag", "prompt": "hi"}),
    ]
    for path, body in cases:
        for headers in (JSON_TEXT, {"Content-Type": "application/x-www-form-urlencoded"}, {}):
            r = open_server.post(path, content=json.dumps(body), headers=headers)
            err = _error(r, 415, "unsupported_media_type")
            assert "application/json" in err["message"]
    assert "planted" not in {c["id"] for c in open_server.get("/v1/collections").json()["data"]}
    assert _doc_names(open_server) == before
    # the JSON type, with parameters or in capitals, is accepted
    r = open_server.post(
        "/v1/collections", content=json.dumps({"name": "typed"}), headers={"Content-Type": "Application/JSON"}
    )
    assert r.status_code == 201, r.text
    r = open_server.delete("/v1/collections/typed")
    assert r.status_code == 200, r.text


def test_form_from_another_origin_cannot_plant_or_delete_a_document(open_server):
    before = _doc_names(open_server)
    form = {"file": ("planted.txt", b"The harbour master is Mallory.", "text/plain")}
    for headers in (
        ELSEWHERE,
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {**OWN, "Sec-Fetch-Site": "cross-site"},
    ):
        r = open_server.post("/v1/documents", files=form, headers=headers)
        assert _error(r, 403, "cross_origin")["type"] == "permission_error"
    assert _doc_names(open_server) == before
    doc = open_server.get("/v1/documents").json()["data"][0]["id"]
    for method, path in (("DELETE", f"/v1/documents/{doc}"), ("DELETE", "/v1/collections/x")):
        _error(open_server.request(method, path, headers=ELSEWHERE), 403, "cross_origin")
    assert _doc_names(open_server) == before
    # a page on the same name but another port (here 80) is another origin
    r = open_server.delete("/v1/collections/x", headers={"Origin": "http://127.0.0.1"})
    _error(r, 403, "cross_origin")
    # the page itself (same origin, Sec-Fetch-Site same-origin) and non-browser clients (no Origin) may
    page = {**OWN, "Sec-Fetch-Site": "same-origin"}
    r = open_server.post("/v1/documents", files=form, headers=page)
    assert r.status_code == 201, r.text
    assert open_server.delete(f"/v1/documents/{r.json()['id']}").status_code == 200
    # reads are not state-changing: another origin's GET is answered (the browser keeps it from the page)
    assert open_server.get("/v1/documents", headers=ELSEWHERE).status_code == 200


def test_foreign_host_is_refused_dns_rebinding(open_server):
    for host in ("attacker.example", "attacker.example:8000", "localhost:9999", "127.0.0.1.nip.io:8000"):
        r = open_server.get("/v1/documents", headers={"Host": host})
        err = _error(r, 421, "misdirected_request")
        assert "--allowed-host" in err["message"] and "harbour" not in r.text
    for host in ("127.0.0.1:8000", "127.0.0.1", "localhost:8000", "LOCALHOST", "[::1]:8000"):
        assert open_server.get("/v1/documents", headers={"Host": host}).status_code == 200, host
    # probes use whatever address they have
    assert open_server.get("/health", headers={"Host": "10.1.2.3:8000"}).status_code == 200


def test_host_policy_of_bind_addresses_and_allowed_hosts():
    loop = HostPolicy.for_bind("127.0.0.1", 8000)
    assert loop.allows("localhost:8000") and loop.allows("[::1]") and not loop.allows("localhost:8001")
    assert not loop.allows("attacker.example") and not loop.allows("") and loop.warning() is None
    v6 = HostPolicy.for_bind("::1", 8000)
    assert v6.allows("[::1]:8000") and v6.allows("127.0.0.1:8000")
    lan = HostPolicy.for_bind("192.168.1.5", 8000, ["rag.example", "proxy.example:8443"])
    assert lan.allows("192.168.1.5:8000") and not lan.allows("localhost:8000")
    assert lan.allows("rag.example") and lan.allows("RAG.example:443")
    assert lan.allows("proxy.example:8443") and not lan.allows("proxy.example")
    everywhere = HostPolicy.for_bind("0.0.0.0", 8000)
    assert everywhere.allows("anything.example") and "--allowed-host" in everywhere.warning()
    assert "Host header checks are off" in HostPolicy.for_bind("::", 8000).warning()
    named = HostPolicy.for_bind("0.0.0.0", 8000, ["rag.example"])
    assert named.allows("rag.example") and named.allows("127.0.0.1:8000") and not named.allows("x.example")
    assert named.warning() is None
    star = HostPolicy.for_bind("0.0.0.0", 8000, ["*"])
    assert star.allows("x.example") and star.warning() is None
    assert loop.serves_origin("localhost:8000") and not loop.serves_origin("localhost")
    assert lan.serves_origin("rag.example") and not lan.serves_origin("rag.example:8080")
    assert not star.serves_origin("x.example")
    for bad in ("http://rag.example", "rag.example/path", "rag.example:http", "[::1"):
        with pytest.raises(ValueError):
            HostPolicy.for_bind("127.0.0.1", 8000, [bad])


def test_origin_behind_a_proxy_that_checks_hosts(backend):
    """`--allowed-host '*'` turns Host checks off, never Origin checks: the Origin must still be the
    request's own Host."""
    star = create_app(Served(backend.engine, "tiny"), hosts=HostPolicy.for_bind("0.0.0.0", 8000, ["*"]))
    with TestClient(star, base_url="https://rag.example") as client:
        body = {"model": "turborag", "prompt": "x", "max_tokens": 1}
        assert client.post("/v1/completions", json=body, headers={"Origin": "https://rag.example"}).is_success
        r = client.post("/v1/completions", json=body, headers={"Origin": "https://evil.example"})
        _error(r, 403, "cross_origin")


def test_cli_refuses_a_malformed_allowed_host(tmp_path, monkeypatch):
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path))
    r = CliRunner().invoke(cli, ["serve", "--allowed-host", "http://rag.example/"])
    assert r.exit_code == 2 and "--allowed-host" in r.output


def test_cli_warns_that_a_wildcard_bind_has_no_host_checks(tmp_path, monkeypatch, tiny_model_dir, caplog):
    """Bound to 0.0.0.0 without --allowed-host: a warning at startup (run_app replaced: nothing is bound)."""
    import turborag.serve.app as serve_app

    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path))
    seen = {}
    monkeypatch.setattr(serve_app, "run_app", lambda app, host, port, **kw: seen.update(app=app))
    with caplog.at_level(logging.WARNING, logger="turborag.serve"):
        r = CliRunner().invoke(cli, ["serve", "--host", "0.0.0.0", "--model", tiny_model_dir])
    assert r.exit_code == 0, r.output
    assert "Host header checks are off" in caplog.text and "--allowed-host" in caplog.text
    with TestClient(seen["app"], base_url="http://anything.example") as client:
        assert client.get("/v1/models").status_code == 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_server_checks_host_and_sends_headers(store_dir, tiny_model_dir):
    """`turborag serve` over loopback: uvicorn passes Host through untouched, and the checks see it."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "turborag", "serve", "--store", str(store_dir), "--port", str(port)]
    cmd += ["--allowed-host", "rag.example"]
    proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        r = httpx.get(url + "/v1/documents", headers={"Host": f"attacker.example:{port}"})
        _error(r, 421, "misdirected_request")
        assert "harbour" not in r.text and r.headers["x-content-type-options"] == "nosniff"
        for host in (f"localhost:{port}", "rag.example"):
            r = httpx.get(url + "/v1/documents", headers={"Host": host})
            assert r.status_code == 200 and "harbour.md" in r.text, (host, r.text)
        page = httpx.get(url + "/")
        assert page.headers["content-security-policy"] == CSP and page.headers["x-frame-options"] == "DENY"
        r = httpx.post(
            url + "/v1/collections", json={"name": "x"}, headers={"Origin": f"http://localhost:{port + 1}"}
        )
        _error(r, 403, "cross_origin")
    finally:
        proc.terminate()
        proc.wait(30)


# -- 2. security headers ------------------------------------------------------------------------------

SECURITY = {"x-content-type-options": "nosniff", "x-frame-options": "DENY", "referrer-policy": "no-referrer"}


def test_every_response_carries_the_security_headers(open_server, keyed):
    page = open_server.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == (
        "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    )
    responses = [
        page,
        open_server.get("/static/app.js"),
        open_server.get("/v1/documents"),
        open_server.get("/nope"),  # 404
        open_server.get("/v1/documents", headers={"Host": "attacker.example"}),  # 421
        keyed.get("/v1/models"),  # 401, from the guard
        keyed.post("/v1/completions", content="x" * 200_000, headers=AUTH),  # 413, from the guard
    ]
    for r in responses:
        for name, value in SECURITY.items():
            assert r.headers.get(name) == value, (r.request.url, r.status_code, name)


def test_page_uses_no_inline_script_or_style():
    """The CSP forbids inline scripts, inline styles and event-handler attributes: the page has none."""
    static = resources.files("turborag.serve").joinpath("static")
    page = static.joinpath("index.html").read_text()
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, re.S | re.I)
    assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts)
    assert not re.search(r"<style\b|\sstyle\s*=|\son[a-z]+\s*=|javascript:", page, re.I)
    js = static.joinpath("app.js").read_text()
    assert not re.search(r"\beval\(|new Function\(|setAttribute\(\s*[\"']style|\.innerHTML\s*=", js)


# -- 3. metrics labels ----------------------------------------------------------------------------------


def test_metrics_label_by_route_template_before_auth(keyed):
    for i in range(200):
        r = keyed.delete(f"/v1/collections/secret-name-{i}")
        assert r.status_code == 401
    keyed.delete(f"/v1/documents/guess-{'x' * 20}", headers=AUTH)  # 404 no_store, on a route with an id
    keyed.get("/v1/scan-me", headers=AUTH)  # no route: the unmatched label
    text = keyed.get("/metrics").text
    series = [line for line in text.splitlines() if line.startswith("turborag_requests_total{")]
    assert 'endpoint="/v1/collections/{name}",status="401"} 200.0' in text
    assert 'endpoint="/v1/documents/{doc_id}"' in text and 'endpoint="unmatched",status="404"' in text
    assert "secret-name" not in text and "guess-" not in text and "scan-me" not in text
    assert len(series) < 10, series


# -- 4. store unavailable -----------------------------------------------------------------------------


class DownStore:
    """A document store whose shared cache store (Redis) cannot be reached."""

    read_only = False

    def add(self, name, data, collection="default", cancelled=None, turn=None):
        raise StoreUnavailable("cannot reach Redis at redis://cache-7.internal:6380/0: Connection refused")


def test_store_unavailable_names_no_host_port_or_url(backend, caplog):
    down = Served(backend.engine, "tiny", documents=DownStore())
    with TestClient(create_app(down), base_url=BASE) as client:
        with caplog.at_level(logging.WARNING, logger="turborag.serve"):
            r = client.post("/v1/documents", json={"name": "a.txt", "text": "Some text."})
    err = _error(r, 503, "store_unavailable")
    assert r.headers["retry-after"] == "5"
    assert "unavailable" in err["message"] and "retry" in err["message"]
    for detail in ("cache-7", "6380", "redis://", "internal"):
        assert detail not in r.text
    assert "redis://cache-7.internal:6380" in caplog.text  # the operator still learns where


# -- 5. content parts and lone surrogates ---------------------------------------------------------------


def _chat(content) -> dict:
    return {"model": "turborag", "messages": [{"role": "user", "content": content}], "max_tokens": 1}


@pytest.mark.parametrize(
    "content,says",
    [
        ([{"type": "text", "text": 5}], "'text' as a string"),
        ([{"type": "text"}], "'text' as a string"),
        (["plain"], "must be an object"),
        ([{"type": "image_url", "image_url": {"url": "data:,"}}], "only 'text' is supported"),
    ],
)
def test_bad_content_parts_are_400(keyed, content, says):
    r = keyed.post("/v1/chat/completions", json=_chat(content), headers=AUTH)
    err = _error(r, 400, "invalid_value")
    assert says in err["message"] and err["param"] == "messages.0.content", err


def test_text_parts_are_still_answered(keyed):
    parts = [{"type": "text", "text": "Who rings "}, {"type": "text", "text": "the bell?"}]
    r = keyed.post("/v1/chat/completions", json=_chat(parts), headers=AUTH)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "path,raw",
    [
        (
            "/v1/chat/completions",
            '{"model": "turborag", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
        ),
        (
            "/v1/chat/completions",
            '{"model": "t", "messages": [{"role": "user", '
            '"content": [{"type": "text", "text": "\\udfff"}]}]}',
        ),
        ("/v1/completions", '{"model": "turborag", "prompt": "\\ud800"}'),
        (
            "/v1/chat/completions",
            '{"model": "turborag", "messages": [{"role": "user", "content": "q"}], "stop": ["\\ud83d"]}',
        ),
    ],
)
def test_lone_surrogates_are_400(keyed, path, raw):
    r = keyed.post(path, content=raw, headers={**AUTH, "Content-Type": "application/json"})
    err = _error(r, 400, "invalid_value")
    assert "not valid Unicode" in err["message"], err


def test_lone_surrogate_in_a_document_is_400(open_server):
    before = _doc_names(open_server)
    raw = '{"name": "s.txt", "text": "half a pair: \\ud800"}'
    r = open_server.post("/v1/documents", content=raw, headers={"Content-Type": "application/json"})
    assert "text: not valid Unicode" in _error(r, 400, "invalid_value")["message"]
    assert _doc_names(open_server) == before
