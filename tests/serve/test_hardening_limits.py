"""Issue 38, the limits of `turborag serve`, each reproduced against a server with a tiny model:

1. a question over `max_question_tokens`, a prompt over `max_prompt_tokens`: 400 before any model work;
2. a huge prompt is refused without tokenizing it, tokenizing and body parsing run off the event loop, so
   `/health` keeps answering meanwhile (a real server subprocess: one process, one GIL, as deployed);
3. a non-streamed request whose client left is cancelled and frees its batch slot;
4. nothing a response reports crosses keys or collections: the prompt cache is partitioned by key, and an
   upload counts as computed every chunk its collection did not use before;
5. JSONL records are documents of their own; a delete while the cache store is down succeeds once; an idle
   server reads 0 in flight; using the model needs read scope; `cache gc` removes orphan uploads.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from helpers import add_key, health, ingest_collections, served_subprocess
from typer.testing import CliRunner

from turborag.bench.serve import ServedApp
from turborag.cli import app
from turborag.cli.cache import UPLOAD_GRACE_S
from turborag.cli.serve import served_for
from turborag.serve import create_app
from turborag.serve.access import Access
from turborag.serve.state import DEFAULT_MAX_PROMPT_TOKENS, DEFAULT_MAX_QUESTION_TOKENS
from turborag.store.disk_tier import BoundedFileBackend, cap_note
from turborag.store.errors import StoreUnavailable
from turborag.store.write_quota import WriteQuota

ADMIN = "sk-admin"
RED = "# Red\n\nThe red tower stands on the red hill, and its bell rings at noon.\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    """An in-process server over a store with collection `red`, the admin key and three scoped keys: two
    readers of `red` (alice, bob) and a write-only key (writer)."""
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("TURBORAG_HOME", str(home))
    store = home / "store"
    ingest_collections(store, home, {"red": RED}, tiny_model_dir)
    keys_file = home / "keys.jsonl"
    keys = {
        "alice": add_key(keys_file, "alice", "--read", "red"),
        "bob": add_key(keys_file, "bob", "--read", "red"),
        "writer": add_key(keys_file, "writer", "--write", "red"),
        "admin": ADMIN,
    }
    backend = served_for(store, None, "cpu", 2)
    with ServedApp(create_app(backend, api_key=ADMIN, access=Access.from_file(keys_file))) as srv:
        srv.store, srv.backend, srv.keys = store, backend, keys
        srv.state = srv.app.state.server
        with httpx.Client(base_url=srv.url, timeout=120) as http:
            srv.http = http
            yield srv
    mp.undo()


def call(srv, who: str, method: str, path: str, **kw) -> httpx.Response:
    return srv.http.request(method, path, headers={"Authorization": f"Bearer {srv.keys[who]}"}, **kw)


def chat(question: str, **turborag) -> dict:
    body = {"model": "turborag", "messages": [{"role": "user", "content": question}], "max_tokens": 1}
    return {**body, "turborag": {"collection": "red", "top_k": 1, **turborag}}


def conversation(system: str, user: str) -> dict:
    """A plain chat (no retrieval) of a system and a user message."""
    body = chat(user, retrieve=False)
    body["messages"] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return body


def completion(prompt: str, **more) -> dict:
    return {"model": "turborag", "prompt": prompt, "max_tokens": 1, **more}


def error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code, err
    return err


# -- 1. per-request bounds --------------------------------------------------------------------------------


def test_question_and_prompt_over_their_caps_are_refused_before_model_work(served, monkeypatch):
    state = served.state
    assert (state.max_question_tokens, state.max_prompt_tokens) == (1024, 8192)  # the defaults
    assert (DEFAULT_MAX_QUESTION_TOKENS, DEFAULT_MAX_PROMPT_TOKENS) == (1024, 8192)
    monkeypatch.setattr(state, "max_question_tokens", 40)
    monkeypatch.setattr(state, "max_prompt_tokens", 100)
    submitted = []
    submit = state.worker.submit
    monkeypatch.setattr(state.worker, "submit", lambda work: submitted.append(work) or submit(work))
    # (path, body, the cap its message names, what it counted); the tiny tokenizer makes a token a character,
    # and a text over 8 characters per allowed token is refused by its length, before it is tokenized
    over = [
        ("/v1/chat/completions", chat("q" * 41), "max_question_tokens", "41 tokens"),
        ("/v1/chat/completions", chat("q" * 321), "max_question_tokens", "321 characters"),
        ("/v1/chat/completions", chat("short?", contexts=["p" * 101]), "max_prompt_tokens", "107 tokens"),
        ("/v1/chat/completions", conversation("s" * 80, "u" * 30), "max_prompt_tokens", "tokens"),
        ("/v1/completions", completion("p" * 100), "max_prompt_tokens", "101 tokens"),  # with BOS
        ("/v1/completions", completion("p" * 801), "max_prompt_tokens", "801 characters"),
    ]
    for path, body, cap, counted in over:
        err = error(call(served, "alice", "POST", path, json=body), 400, "context_length_exceeded")
        message = err["message"]
        assert cap in message and counted in message and re.search(r"\b(40|100) tokens\b", message), err
    assert not submitted  # refused before the model worker saw anything
    assert call(served, "alice", "POST", "/v1/chat/completions", json=chat("q" * 39 + "?")).status_code == 200
    assert call(served, "alice", "POST", "/v1/completions", json=completion("p" * 99)).status_code == 200
    assert len(submitted) == 2


class WatchedTokenizer:
    """A tokenizer that records, per call, whether it ran on a thread running an event loop."""

    def __init__(self, tok):
        self._tok = tok
        self.on_loop: list[bool] = []

    def __call__(self, *args, **kwargs):
        try:
            asyncio.get_running_loop()
            self.on_loop.append(True)
        except RuntimeError:
            self.on_loop.append(False)
        return self._tok(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_requests_are_tokenized_off_the_event_loop(served, monkeypatch):
    watched = WatchedTokenizer(served.backend.engine.lm.tokenizer)
    monkeypatch.setattr(served.backend.engine.lm, "tokenizer", watched)
    for path, body in (
        ("/v1/completions", completion("The red tower")),
        ("/v1/chat/completions", chat("Where is the tower?")),
        ("/v1/chat/completions", chat("Where is the tower?", retrieve=False)),
        ("/v1/chat/completions", chat("Where is the tower?", contexts=["The tower is on the hill."])),
    ):
        assert call(served, "alice", "POST", path, json=body).status_code == 200
    assert watched.on_loop and not any(watched.on_loop)


# -- 2. the event loop never tokenizes or parses a huge body ------------------------------------------------


@pytest.fixture(scope="module")
def real_server(tmp_path_factory, tiny_model_dir):
    """`turborag serve --model DIR` (no store, no key) in a subprocess on a loopback port."""
    with served_subprocess(["--model", tiny_model_dir], tmp_path_factory.mktemp("real")) as url:
        yield url


def _probe_health_while(url: str, send) -> tuple[httpx.Response, list[float]]:
    """Send a request in a thread (`send(client)`) and time `/health` again and again until it is answered:
    (its response, the seconds each probe took)."""
    got: list[httpx.Response] = []

    def run():
        with httpx.Client(timeout=120) as http:
            got.append(send(http))

    sender = threading.Thread(target=run)
    sender.start()
    waits: list[float] = []
    with httpx.Client(timeout=30) as http:
        while sender.is_alive() or not waits:
            t0 = time.monotonic()
            assert http.get(f"{url}/health").status_code == 200
            waits.append(time.monotonic() - t0)
            time.sleep(0.02)
    sender.join()
    return got[0], waits


def test_huge_prompt_is_refused_at_once_and_health_keeps_answering(real_server):
    huge = "word " * 1_600_000  # 8 MB: tokenizing it on the event loop froze every endpoint for seconds
    for path, body in (
        ("/v1/completions", completion(huge)),
        ("/v1/chat/completions", chat(huge, retrieve=False)),
    ):
        t0 = time.monotonic()
        r, waits = _probe_health_while(
            real_server, lambda http, p=path, b=body: http.post(real_server + p, json=b)
        )
        err = error(r, 400, "context_length_exceeded")
        assert "max_prompt_tokens" in err["message"] and "8192 tokens" in err["message"]
        assert time.monotonic() - t0 < 20
        assert max(waits) < 1.0, waits


def test_body_of_many_messages_is_parsed_off_the_event_loop(real_server):
    """200,000 messages take seconds to validate: not on the event loop."""
    body = {"model": "turborag", "messages": [{"role": "user", "content": "hi"}] * 200_000}
    body["turborag"] = {"retrieve": False}
    r, waits = _probe_health_while(
        real_server, lambda http: http.post(real_server + "/v1/chat/completions", json=body)
    )
    error(r, 400, "context_length_exceeded")
    assert max(waits) < 1.0, waits


# -- 3. a client that leaves a non-streamed request cancels it --------------------------------------------


def test_client_leaving_a_non_stream_request_frees_its_batch_slot(real_server):
    port = int(real_server.rsplit(":", 1)[1])
    body = json.dumps(completion("The harbour", max_tokens=4000, min_tokens=4000)).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head + body)
        deadline = time.time() + 30
        while health(real_server, 5)["queue_depth"] != 1:  # queued or generating its 4000 tokens
            assert time.time() < deadline
            time.sleep(0.05)
    t0 = time.monotonic()  # the client has gone
    while health(real_server, 5)["queue_depth"] != 0:
        assert time.monotonic() - t0 < 3, "the request went on generating for nobody"
        time.sleep(0.05)
    metrics = httpx.get(f"{real_server}/metrics").text
    assert 'turborag_requests_total{endpoint="/v1/completions",status="499"} 1.0' in metrics
    assert re.search(r"^turborag_batch_size 0\.0$", metrics, re.M), metrics


# -- 4. no signal across keys or collections ---------------------------------------------------------------


def test_prompt_cache_is_partitioned_by_key(served):
    prompt = "The harbour master of Velmora rings a brass bell at six every morning. " * 3  # > 2 blocks of 64

    def cached(who: str, body: dict, path: str = "/v1/completions") -> int:
        r = call(served, who, "POST", path, json=body)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("alice", completion(prompt)) == 0
    assert cached("alice", completion(prompt)) >= 128  # the same key reuses its own prefix
    assert cached("bob", completion(prompt)) == 0  # another key does not learn that alice sent it
    assert cached("bob", completion(prompt)) >= 128
    talk = chat(prompt, retrieve=False)
    path = "/v1/chat/completions"
    assert cached("alice", talk, path) == 0 and cached("alice", talk, path) >= 128
    assert cached("bob", talk, path) == 0


def test_upload_counts_computed_chunks_per_collection(served):
    for name in ("left", "right"):
        assert call(served, "admin", "POST", "/v1/collections", json={"name": name}).status_code == 201
    text = "The quiblet bird nests only in copper towers, and it sings at dusk over the marshes."
    store = served.backend.engine.store

    def upload(name: str, collection: str) -> dict:
        doc = {"name": name, "text": text, "collection": collection}
        r = call(served, "admin", "POST", "/v1/documents", json=doc)
        assert r.status_code == 201, r.text
        return r.json()

    before = set(store.keys())
    left = upload("birds.txt", "left")
    stored = set(store.keys()) - before
    right = upload("birds.txt", "right")
    # the second collection is told what its own first upload of the text is told...
    assert left["computed_chunks"] == right["computed_chunks"] == len(stored) >= 1
    assert set(store.keys()) - before == stored  # ...while the caches are still shared underneath
    assert upload("birds-again.txt", "left")["computed_chunks"] == 0  # chunks its collection already uses


def _cache_files(store: Path) -> dict[str, int]:
    """The chunk cache files (not the disk tier's usage index and lock)."""
    files = (f for f in (store / "kv").rglob("*") if f.is_file())
    return {str(f): f.stat().st_size for f in files if ".sqlite" not in f.name and f.suffix != ".lock"}


def test_a_readers_own_passages_never_grow_the_store(served):
    """Ad-hoc `turborag.contexts` from a key that may only read: computed for the request, never written
    (computed again next time); from a key that may write the collection: stored once."""
    passages = [
        f"Passage {i}: the lantern maker of Oskel sold {i} green lanterns at the spring fair."
        for i in range(4)
    ]
    body = chat("How many lanterns?", contexts=passages, mode="turbo")
    before = _cache_files(served.store)
    for _ in range(2):
        r = call(served, "alice", "POST", "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["turborag"]["computed_chunks"] == len(passages)
        assert _cache_files(served.store) == before
    r = call(served, "admin", "POST", "/v1/chat/completions", json=body)
    assert r.json()["turborag"]["computed_chunks"] == len(passages)
    assert len(_cache_files(served.store)) == len(before) + len(passages)
    r = call(served, "admin", "POST", "/v1/chat/completions", json=body)
    assert r.json()["turborag"]["computed_chunks"] == 0


def test_a_writers_own_passages_are_bounded_by_its_quota(served, tmp_path, monkeypatch):
    """A key that may write stores its own passages' caches until its quota is spent, which survives a
    restart; beyond it, 429 naming the quota, before any model work and with nothing written."""
    state = served.state

    def ask(passages: list[str]) -> httpx.Response:
        body = chat("Which colour?", contexts=passages, mode="turbo")
        return call(served, "admin", "POST", "/v1/chat/completions", json=body)

    first = [f"Quota passage {i}: the kite of Vell is painted {c}." for i, c in enumerate(["blue", "gold"])]
    monkeypatch.setattr(state, "write_quota", WriteQuota(tmp_path, 1 << 40))
    before = _cache_files(served.store)
    assert ask(first).status_code == 200
    spent, added = state.write_quota.used("admin"), _cache_files(served.store).keys() - before.keys()
    # the tensors' bytes were charged; each file adds a header of a few hundred bytes
    added_bytes = sum(_cache_files(served.store)[f] for f in added)
    assert added and spent < added_bytes < spent + 2048 * len(added)

    # the same ledger reopened (a restart) with a quota of one byte more: the count carries over
    monkeypatch.setattr(state, "write_quota", WriteQuota(tmp_path, spent + 1))
    before = _cache_files(served.store)
    r = ask([f"Quota passage {i}: the drum of Vell is painted red." for i in range(2)])
    err = error(r, 429, "quota_exceeded")
    assert "--max-cache-bytes-per-key" in err["message"] and "'admin'" in err["message"]
    assert _cache_files(served.store) == before and state.write_quota.used("admin") == spent
    r = ask(first)  # what the store holds costs nothing
    assert r.status_code == 200 and r.json()["turborag"]["computed_chunks"] == 0


def test_a_served_store_gets_a_disk_cap_unless_one_was_recorded(served, tmp_path, tiny_model_dir):
    """No cap recorded: the server caps the caches at what they hold plus half the free disk. A cap of 0
    recorded by `ingest --max-disk-bytes 0` is the operator's choice of none, and is kept."""
    backend = served.backend.engine.store.backend
    assert isinstance(backend, BoundedFileBackend) and backend.max_bytes > backend.used_bytes()
    assert "capped at" in cap_note(backend)

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "red.md").write_text(RED)
    store = tmp_path / "uncapped"
    args = ["ingest", str(tmp_path / "docs"), "--store", str(store), "--model", tiny_model_dir]
    assert CliRunner().invoke(app, [*args, "--max-disk-bytes", "0"]).exit_code == 0
    uncapped = served_for(store, None, "cpu", 2).engine.store.backend
    assert not isinstance(uncapped, BoundedFileBackend) and "without a cap" in cap_note(uncapped)


# -- 5. smaller items --------------------------------------------------------------------------------------


def test_jsonl_records_are_documents_of_their_own(served):
    lines = [
        {"id": "a", "text": "The amber lantern hangs in the north gate of the old city."},
        {"id": "b", "text": "The blue ferry crosses the bay twice an hour in summer."},
    ]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    files = {"file": ("notes.jsonl", data)}
    up = call(served, "admin", "POST", "/v1/documents", files=files, data={"collection": "red"})
    assert up.status_code == 201, up.text
    upload = up.json()
    records = upload["documents"]
    assert len(set(records)) == 2 and upload["id"] not in records
    listed = listing(served)
    assert {listed[r]["name"] for r in records} == {"notes.jsonl#a", "notes.jsonl#b"}
    r = call(
        served, "admin", "POST", "/v1/chat/completions", json=chat("Which ferry crosses the bay?", top_k=8)
    )
    refs = [c for c in r.json()["turborag"]["chunks"] if c["document"] in records]
    assert len({c["document"] for c in refs}) == 2 and len({c["id"] for c in refs}) == len(refs) == 2
    # one record is deleted alone, then the upload's id deletes the rest
    one = call(served, "admin", "DELETE", f"/v1/documents/{records[0]}", params={"collection": "red"})
    assert one.status_code == 200, one.text
    assert records[0] not in listing(served) and records[1] in listing(served)
    rest = call(served, "admin", "DELETE", f"/v1/documents/{upload['id']}", params={"collection": "red"})
    assert rest.status_code == 200 and records[1] not in listing(served)


def listing(srv) -> dict[str, dict]:
    """The documents of collection `red` by id."""
    r = call(srv, "admin", "GET", "/v1/documents", params={"collection": "red"})
    return {d["id"]: d for d in r.json()["data"]}


def test_delete_while_the_cache_store_is_down_is_done_once(served, monkeypatch):
    text = "The glass heron visits the quarry pond in early spring."
    up = call(
        served, "admin", "POST", "/v1/documents", json={"name": "gone.txt", "text": text, "collection": "red"}
    )
    assert up.status_code == 201, up.text
    store = served.backend.engine.store
    keys = set(store.keys())

    def down(_key):
        raise StoreUnavailable("cannot reach Redis at redis://10.0.0.7:6379: connection refused")

    monkeypatch.setattr(store, "delete", down)
    path = f"/v1/documents/{up.json()['id']}"
    gone = call(served, "admin", "DELETE", path, params={"collection": "red"})
    assert gone.status_code == 200, gone.text  # the document is deleted: no 503 after the fact
    assert call(served, "admin", "DELETE", path, params={"collection": "red"}).status_code == 404
    monkeypatch.undo()
    assert set(store.keys()) == keys  # its cache is left in the store, named by no chunk...
    r = CliRunner().invoke(app, ["cache", "gc", "--store", str(served.store), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["files_removed"] >= 1
    assert set(store.keys()) < keys  # ...until `cache gc` deletes it


def test_idle_server_reads_zero_in_flight(served):
    assert call(served, "admin", "GET", "/v1/documents", params={"collection": "red"}).status_code == 200
    deadline = time.time() + 3
    while True:
        metrics = served.http.get("/metrics").text
        depth = served.http.get("/health").json()["queue_depth"]
        gauges = re.findall(r"^turborag_(queue_depth|batch_size) (\S+)$", metrics, re.M)
        if depth == 0 and dict(gauges) == {"queue_depth": "0.0", "batch_size": "0.0"}:
            break
        assert time.time() < deadline, (depth, gauges)
        time.sleep(0.1)


def test_using_the_model_needs_read_scope(served):
    for path, body in (
        ("/v1/completions", completion("The red tower")),
        ("/v1/chat/completions", chat("Where?", retrieve=False)),
        ("/v1/chat/completions", chat("Where?", contexts=["The tower is on the hill."])),
        ("/v1/chat/completions", chat("Where?")),
    ):
        r = call(served, "writer", "POST", path, json=body)
        assert error(r, 403, "permission_denied")["message"], r.text
        assert call(served, "alice", "POST", path, json=body).status_code == 200
    up = {"name": "w.txt", "text": "Written by the ingestion key.", "collection": "red"}
    assert call(served, "writer", "POST", "/v1/documents", json=up).status_code == 201  # it may still write


def test_cache_gc_removes_orphan_uploads_only(served):
    uploads = served.store / "uploads"
    doc = {"name": "k.txt", "text": "Kept text.", "collection": "red"}
    kept = call(served, "admin", "POST", "/v1/documents", json=doc)
    assert kept.status_code == 201, kept.text
    old = time.time() - UPLOAD_GRACE_S - 60
    folders = {
        "kept": uploads / kept.json()["id"],
        "orphan": uploads / "0123456789abcdef",
        "fresh": uploads / "fedcba9876543210",
    }
    for name in ("orphan", "fresh"):  # left by a server killed mid-ingest; `fresh` may be one in flight
        folders[name].mkdir()
        (folders[name] / "x.txt").write_text("Half-ingested upload.")
    for name in ("kept", "orphan"):
        for f in (*folders[name].iterdir(), folders[name]):
            os.utime(f, (old, old))
    r = CliRunner().invoke(app, ["cache", "gc", "--store", str(served.store), "--json"])
    assert r.exit_code == 0, r.output
    assert not folders["orphan"].exists()
    assert folders["kept"].is_dir() and folders["fresh"].is_dir()


def test_an_upload_whose_client_left_is_taken_back(tmp_path, tiny_model_dir, monkeypatch):
    """The client of an upload leaves while its caches are computed: the ingest stops at its next batch and
    the store is as before (no document, no upload folder, no cache that nothing uses), with a 499."""
    import threading

    from typer.testing import CliRunner

    from turborag.cli import app as cli
    from turborag.cli.serve import served_for
    from turborag.serve.errors import APIError

    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("The harbour master rings a brass bell at six.\n")
    store = tmp_path / "store"
    args = ["ingest", str(tmp_path / "docs"), "--store", str(store), "--model", tiny_model_dir]
    assert CliRunner().invoke(cli, [*args, "--chunk-tokens", "16"]).exit_code == 0
    docs = served_for(store, None, "cpu", 8).documents
    before_docs, before_caches = docs.list(), set(docs.engine.store.keys())
    text = " ".join(f"Sentence {i} of a long upload about the lighthouse keeper." for i in range(300))
    cancelled = threading.Event()
    advance = docs.engine.precompute_ids

    def leave_after_first_batch(chunks, on_batch=None):  # the client leaves during the first batch
        def on(n, tokens):
            cancelled.set()
            if on_batch:
                on_batch(n, tokens)

        return advance(chunks, on_batch=on)

    monkeypatch.setattr(docs.engine, "precompute_ids", leave_after_first_batch)
    with pytest.raises(APIError) as e:
        docs.add("long.txt", text.encode(), "default", cancelled)
    assert e.value.status == 499
    assert docs.list() == before_docs
    assert set(docs.engine.store.keys()) == before_caches
    assert not any((store / "uploads").iterdir())


def test_a_key_has_at_most_max_uploads_per_key_in_progress(tmp_path, tiny_model_dir, monkeypatch):
    """With one upload slot per key, a second upload while the first is being ingested gets 429 with
    Retry-After; once the first is done, uploads are taken again."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from typer.testing import CliRunner

    from turborag.bench.serve import ServedApp
    from turborag.cli import app as cli
    from turborag.cli.serve import served_for
    from turborag.serve import create_app

    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("The harbour master rings a brass bell at six.\n")
    store = tmp_path / "store"
    args = ["ingest", str(tmp_path / "docs"), "--store", str(store), "--model", tiny_model_dir]
    assert CliRunner().invoke(cli, args).exit_code == 0
    backend = served_for(store, None, "cpu", 8)
    entered, release = threading.Event(), threading.Event()
    add = backend.documents.add

    def slow_add(*a, **kw):  # the first upload holds its slot until released
        entered.set()
        release.wait(30)
        return add(*a, **kw)

    monkeypatch.setattr(backend.documents, "add", slow_add)
    with ServedApp(create_app(backend, max_uploads_per_key=1)) as srv:
        doc = {"name": "b.txt", "text": "The lighthouse is painted red and white."}
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, srv.url + "/v1/documents", json=doc, timeout=60)
            assert entered.wait(30)
            second = httpx.post(srv.url + "/v1/documents", json={**doc, "name": "c.txt"}, timeout=60)
            assert second.status_code == 429 and second.headers["retry-after"] == "5"
            assert second.json()["error"]["code"] == "too_many_uploads"
            release.set()
            assert first.result().status_code == 201
        third = httpx.post(srv.url + "/v1/documents", json={**doc, "name": "d.txt"}, timeout=60)
        assert third.status_code == 201


@pytest.mark.parametrize("recovery", ["restart", "cache gc"])
def test_an_upload_cut_short_by_sigkill_is_rolled_back(tmp_path, tiny_model_dir, recovery):
    """A server killed with SIGKILL in its upload's second group of caches (the first group's documents
    committed, later batches' caches stored, nothing told to the client): the next start, or `cache gc`,
    leaves no document, folder, journal marker or cache of that upload, and the store as before."""
    env = {**os.environ, "TURBORAG_HOME": str(tmp_path / "home")}
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("The harbour master rings a brass bell at six.\n")
    store = tmp_path / "store"
    args = ["ingest", str(tmp_path / "docs"), "--store", str(store), "--model", tiny_model_dir]
    assert CliRunner().invoke(app, [*args, "--chunk-tokens", "16"], env=env).exit_code == 0
    before = _cache_files(store)
    text = " ".join(f"Sentence {i} of a long upload about the lighthouse keeper." for i in range(200))
    child = (
        "import os, signal, sys\n"
        "import turborag.core.kv as kv\n"
        "real, batches = kv.precompute_chunks, [0]\n"
        "def patched(*a, on_batch=None, **k):\n"
        "    def counted(n, tokens):\n"
        "        batches[0] += 1\n"
        "        if batches[0] == 10:\n"  # batches of 4: the first group (32) is committed, then 2 more
        "            os.kill(os.getpid(), signal.SIGKILL)\n"
        "        if on_batch:\n"
        "            on_batch(n, tokens)\n"
        "    return real(*a, on_batch=counted, **k)\n"
        "kv.precompute_chunks = patched\n"
        "from turborag.cli.serve import served_for\n"
        f"docs = served_for({str(store)!r}, None, 'cpu', 8).documents\n"
        f"docs.add('long.txt', {text!r}.encode(), 'default')\n"
    )
    proc = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    uploads = store / "uploads"
    assert len(list(uploads.glob("*.ingesting"))) == 1 and len(_cache_files(store)) > len(before)
    if recovery == "restart":
        from turborag.cli.serve import served_for

        mp = pytest.MonkeyPatch()
        mp.setenv("TURBORAG_HOME", str(tmp_path / "home"))
        try:
            docs = served_for(store, None, "cpu", 8).documents
            assert [d["name"] for d in docs.list()] == ["a.txt"]
        finally:
            mp.undo()
    else:
        r = CliRunner().invoke(app, ["cache", "gc", "--store", str(store), "--json"], env=env)
        assert r.exit_code == 0, r.output
    assert not any(uploads.iterdir())  # no folder, no marker
    assert _cache_files(store) == before
