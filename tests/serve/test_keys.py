"""Scoped keys: a key of one collection cannot read, list, write or delete another on any route (403 in
OpenAI's shape); keys are stored hashed; `--api-key` still opens everything; `/metrics` can need a key."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers import ingest_collections
from typer.testing import CliRunner

from turborag.bench.serve import ServedApp
from turborag.cli import app
from turborag.cli.serve import served_for
from turborag.serve import create_app
from turborag.serve.access import Access, key_hash

ADMIN = "sk-admin"


def add_key(keys_file, name: str, *args: str) -> str:
    r = CliRunner().invoke(app, ["keys", "add", name, "--keys", str(keys_file), *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])["key"]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("TURBORAG_HOME", str(home))
    store = home / "store"
    texts = {n: f"# {n}\n\nThe {n} tower stands on the {n} hill.\n" for n in ("red", "blue")}
    ingest_collections(store, home, texts, tiny_model_dir)
    keys_file = home / "keys.jsonl"
    keys = {
        "red": add_key(keys_file, "red-team", "--read", "red", "--write", "red"),
        "blue-reader": add_key(keys_file, "blue-reader", "--read", "blue"),
        "everything": add_key(keys_file, "ops", "--read", "*", "--write", "*"),
    }
    backend = served_for(store, None, "cpu", 2)
    the_app = create_app(backend, api_key=ADMIN, access=Access.from_file(keys_file), metrics_key="m-key")
    with ServedApp(the_app) as srv:
        srv.keys, srv.keys_file, srv.backend = keys, keys_file, backend
        with httpx.Client(base_url=srv.url, timeout=120) as http:
            srv.http = http
            admin = {"Authorization": f"Bearer {ADMIN}"}
            up = http.post(
                "/v1/documents",
                json={"name": "b.txt", "text": "Blue fact.", "collection": "blue"},
                headers=admin,
            )
            assert up.status_code == 201, up.text
            srv.blue_doc = up.json()["id"]
            yield srv
    mp.undo()


def as_key(srv, key: str, method: str, path: str, **kw) -> httpx.Response:
    return srv.http.request(method, path, headers={"Authorization": f"Bearer {key}"}, **kw)


def chat(collection: str) -> dict:
    return {
        "model": "turborag",
        "messages": [{"role": "user", "content": "Where is the tower?"}],
        "max_tokens": 1,
        "turborag": {"collection": collection, "top_k": 1},
    }


def forbidden(r: httpx.Response) -> bool:
    err = r.json().get("error", {})
    return (
        r.status_code == 403
        and err.get("type") == "permission_error"
        and err.get("code") == "permission_denied"
    )


def test_keys_are_stored_hashed(served):
    text = served.keys_file.read_text()
    for key in served.keys.values():
        assert key not in text and key_hash(key) in text
    assert ADMIN not in text
    listed = CliRunner().invoke(app, ["keys", "list", "--keys", str(served.keys_file), "--json"])
    assert listed.exit_code == 0 and not any(k in listed.stdout for k in served.keys.values())


def test_a_key_of_one_collection_cannot_touch_another(served):
    red, doc = served.keys["red"], served.blue_doc
    attempts = [
        ("POST", "/v1/chat/completions", {"json": chat("blue")}),
        ("GET", "/v1/documents", {"params": {"collection": "blue"}}),
        ("POST", "/v1/documents", {"json": {"name": "x.txt", "text": "Red was here.", "collection": "blue"}}),
        (
            "POST",
            "/v1/documents",
            {"files": {"file": ("x.txt", b"Red was here.")}, "data": {"collection": "blue"}},
        ),
        (
            "POST",
            "/v1/documents",
            {"json": {"name": "x.txt", "text": "Red was here."}, "params": {"collection": "blue"}},
        ),
        ("DELETE", f"/v1/documents/{doc}", {"params": {"collection": "blue"}}),
        ("POST", "/v1/collections", {"json": {"name": "blue"}}),
        ("DELETE", "/v1/collections/blue", {}),
        ("POST", "/v1/collections", {"json": {"name": "purple"}}),  # creating needs write on the new name
        ("POST", "/v1/chat/completions", {"json": chat("default")}),
    ]
    for method, path, kw in attempts:
        r = as_key(served, red, method, path, **kw)
        assert forbidden(r), (method, path, r.status_code, r.text)
    # the other collection is untouched and still answers for a key that may read it
    names = [c["id"] for c in as_key(served, red, "GET", "/v1/collections").json()["data"]]
    assert names == ["red"]
    reader = served.keys["blue-reader"]
    listed = as_key(served, reader, "GET", "/v1/documents", params={"collection": "blue"})
    assert listed.status_code == 200 and any(d["id"] == doc for d in listed.json()["data"])
    assert as_key(served, reader, "POST", "/v1/chat/completions", json=chat("blue")).status_code == 200


def test_a_key_works_inside_its_scope(served):
    red = served.keys["red"]
    r = as_key(served, red, "POST", "/v1/chat/completions", json=chat("red"))
    assert r.status_code == 200 and {c["name"] for c in r.json()["turborag"]["chunks"]} == {"red.md"}
    up = as_key(
        served, red, "POST", "/v1/documents", json={"name": "r.txt", "text": "Red fact.", "collection": "red"}
    )
    assert up.status_code == 201
    assert (
        as_key(
            served, red, "DELETE", f"/v1/documents/{up.json()['id']}", params={"collection": "red"}
        ).status_code
        == 200
    )
    # plain completions and models need only a valid key
    assert as_key(served, red, "GET", "/v1/models").status_code == 200


def test_read_only_key_cannot_write(served):
    reader = served.keys["blue-reader"]
    up = as_key(
        served, reader, "POST", "/v1/documents", json={"name": "x.txt", "text": "x", "collection": "blue"}
    )
    assert forbidden(up)
    assert forbidden(
        as_key(served, reader, "DELETE", f"/v1/documents/{served.blue_doc}", params={"collection": "blue"})
    )


def test_api_key_and_star_key_open_everything(served):
    for key in (ADMIN, served.keys["everything"]):
        names = {c["id"] for c in as_key(served, key, "GET", "/v1/collections").json()["data"]}
        assert {"default", "red", "blue"} <= names
        assert as_key(served, key, "POST", "/v1/chat/completions", json=chat("blue")).status_code == 200
    assert as_key(served, "not-a-key", "GET", "/v1/collections").status_code == 401
    assert served.http.get("/v1/collections").status_code == 401


def test_metrics_key_and_open_health(served):
    assert served.http.get("/health").status_code == 200
    assert served.http.get("/metrics").status_code == 401
    assert as_key(served, served.keys["red"], "GET", "/metrics").status_code == 401
    assert as_key(served, "m-key", "GET", "/metrics").status_code == 200


def test_keys_cli_errors(tmp_path):
    f = tmp_path / "k.jsonl"
    r = CliRunner().invoke(app, ["keys", "add", "x", "--keys", str(f)])
    assert r.exit_code == 2 and "needs --read or --write" in r.output
    r = CliRunner().invoke(app, ["keys", "add", "x", "--keys", str(f), "--read", "a/b"])
    assert r.exit_code == 2 and "invalid collection name" in r.output
    add_key(f, "x", "--read", "a")
    r = CliRunner().invoke(app, ["keys", "add", "x", "--keys", str(f), "--read", "a"])
    assert r.exit_code == 2 and "already" in r.output
    assert CliRunner().invoke(app, ["keys", "remove", "x", "--keys", str(f)]).exit_code == 0
    assert CliRunner().invoke(app, ["keys", "remove", "x", "--keys", str(f)]).exit_code == 2
    # serve refuses a missing or malformed keys file before loading anything
    r = CliRunner().invoke(app, ["serve", "--keys", str(tmp_path / "none.jsonl")])
    assert r.exit_code == 2 and "no such file" in r.output
    f.write_text('{"name": "x", "sha256": "plain-text-key", "read": ["a"]}\n')
    r = CliRunner().invoke(app, ["serve", "--keys", str(f)])
    assert r.exit_code == 2 and "line 1" in r.output and "sha256" in r.output


def test_serve_warns_when_metrics_are_open_to_keyless_clients(tmp_path, monkeypatch, tiny_model_dir, caplog):
    """An API that needs a key with /metrics that does not: a warning at startup; --metrics-key quiets it
    (run_app replaced: nothing is bound)."""
    import logging

    import turborag.serve.app as serve_app

    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path))
    monkeypatch.delenv("TURBORAG_METRICS_KEY", raising=False)
    monkeypatch.setattr(serve_app, "run_app", lambda app, host, port, **kw: None)
    args = ["serve", "--model", tiny_model_dir, "--api-key", "sk-a"]
    with caplog.at_level(logging.WARNING, logger="turborag.serve"):
        r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "/metrics answers without a key" in caplog.text and "--metrics-key" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="turborag.serve"):
        r = CliRunner().invoke(app, [*args, "--metrics-key", "sk-m"])
    assert r.exit_code == 0, r.output
    assert "/metrics answers without a key" not in caplog.text
