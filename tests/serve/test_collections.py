"""Collections over HTTP on a tiny model: retrieval never crosses collections, shared caches are computed
once and dropped only when no collection uses them, upload counts agree with the catalog, and no response
body (errors included) carries the store's server path or a stack trace."""

from __future__ import annotations

import httpx
import pytest
from helpers import ingest_collections

from turborag.bench.serve import ServedApp
from turborag.cli.serve import served_for
from turborag.serve import create_app
from turborag.store.catalog import Catalog

KEY = "sk-admin"
RED = "The lighthouse of Velmora is painted red and its keeper is called Odrun Pask."
BLUE = "The lighthouse of Velmora is painted blue and its keeper is called Mirel Tosk."
QUESTION = "What colour is the lighthouse of Velmora?"


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("TURBORAG_HOME", str(home))
    store = home / "store"
    texts = {name: f"# Lighthouse\n\n{text}\n" for name, text in (("red", RED), ("blue", BLUE))}
    ingest_collections(store, home, texts, tiny_model_dir)
    backend = served_for(store, None, "cpu", 4)
    bodies: list[str] = []

    def keep(response: httpx.Response) -> None:
        response.read()
        bodies.append(response.text)

    with ServedApp(create_app(backend, api_key=KEY, max_body_bytes=100_000, metrics_key="m-key")) as srv:
        srv.store, srv.backend, srv.bodies = store, backend, bodies
        srv.http = httpx.Client(
            base_url=srv.url,
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=120,
            event_hooks={"response": [keep]},
        )
        yield srv
        srv.http.close()
    mp.undo()


def ask(srv, collection: str | None, question: str = QUESTION, **more) -> httpx.Response:
    opts = {"top_k": 3, **({"collection": collection} if collection else {})}
    body = {"model": "turborag", "messages": [{"role": "user", "content": question}], "max_tokens": 2}
    return srv.http.post("/v1/chat/completions", json={**body, "turborag": opts}, **more)


def test_each_collection_answers_from_its_own(served):
    for name in ("red", "blue"):
        r = ask(served, name)
        assert r.status_code == 200, r.text
        extra = r.json()["turborag"]
        assert extra["collection"] == name and extra["chunks"]
        assert {c["name"] for c in extra["chunks"]} == {f"{name}.md"}  # never the other collection's fact
        ids = {d["id"] for d in served.http.get("/v1/documents", params={"collection": name}).json()["data"]}
        assert {c["document"] for c in extra["chunks"]} <= ids
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # `default` holds neither: nothing was ingested into it, so its answer uses no chunk
    assert ask(served, None).json()["turborag"]["chunks"] == []


def test_chunks_named_by_document_and_ordinal(served):
    for c in ask(served, "red").json()["turborag"]["chunks"]:
        assert set(c) == {"id", "document", "ordinal", "name", "text"}  # text: what the answer read
        assert c["id"] == f"{c['document']}#{c['ordinal']}" and "/" not in c["id"] and c["text"]


def test_collections_created_listed_and_deleted(served):
    h = served.http
    r = h.post("/v1/collections", json={"name": "green"})
    assert r.status_code == 201 and r.json()["id"] == "green"
    assert h.post("/v1/collections", json={"name": "green"}).status_code == 409
    names = [c["id"] for c in h.get("/v1/collections").json()["data"]]
    assert {"default", "red", "blue", "green"} <= set(names)
    assert h.delete("/v1/collections/green").json()["deleted"] is True
    assert h.delete("/v1/collections/green").status_code == 404
    assert ask(served, "green").status_code == 404
    assert h.delete("/v1/collections/default").status_code == 400


def test_same_text_cached_once_and_counts_agree_with_the_catalog(served):
    h = served.http
    h.post("/v1/collections", json={"name": "copy"})
    text = "The quiblet bird nests only in copper towers, and it sings at dusk."
    store = served.backend.engine.store
    before = set(store.keys())
    first = h.post("/v1/documents", json={"name": "birds.txt", "text": text, "collection": "red"})
    after_first = set(store.keys())
    second = h.post("/v1/documents", json={"name": "birds.txt", "text": text, "collection": "copy"})
    assert first.status_code == second.status_code == 201, (first.text, second.text)
    a, b = first.json(), second.json()
    assert set(store.keys()) == after_first  # the cache is shared, not recomputed...
    # ...but each upload counts what is new to its own collection (issue 38: no signal across collections)
    assert a["computed_chunks"] == b["computed_chunks"] == len(after_first - before) >= 1
    assert b["tokens"] == a["tokens"] > 0 and b["chunks"] == a["chunks"]
    listed = {d["id"]: d for d in h.get("/v1/documents", params={"collection": "copy"}).json()["data"]}
    assert listed[b["id"]]["tokens"] == b["tokens"] and listed[b["id"]]["chunks"] == b["chunks"]
    # a document of one collection is not deleted through another, and its upload stays
    assert h.delete(f"/v1/documents/{a['id']}", params={"collection": "copy"}).status_code == 404
    assert any(
        d["id"] == a["id"] for d in h.get("/v1/documents", params={"collection": "red"}).json()["data"]
    )
    assert h.delete(f"/v1/documents/{a['id']}", params={"collection": "red"}).status_code == 200


def _keys_of(store, collection: str) -> set[str]:
    cat = Catalog(store).use(collection)
    try:
        return {k for k, _ in cat.collection_cache_entries()}
    finally:
        cat.close()


def test_deleted_collection_drops_only_unshared_caches(served):
    h, kv = served.http, served.backend.engine.store
    assert h.post("/v1/collections", json={"name": "tmp"}).status_code == 201
    shared = "The copper bell of Arn rings thirteen times at noon on market days."
    own = "Only the tmp collection knows that the ferry to Oskel leaves at nine."
    for name, text in (("shared.txt", shared), ("own.txt", own)):
        r = h.post("/v1/documents", json={"name": name, "text": text, "collection": "tmp"})
        assert r.status_code == 201, r.text
    r = h.post("/v1/documents", json={"name": "shared.txt", "text": shared, "collection": "blue"})
    assert r.status_code == 201
    tmp_keys, blue_keys = _keys_of(served.store, "tmp"), _keys_of(served.store, "blue")
    only_tmp, both = tmp_keys - blue_keys, tmp_keys & blue_keys
    assert only_tmp and both and all(k in kv for k in tmp_keys)
    assert h.delete("/v1/collections/tmp").status_code == 200
    assert not any(k in kv for k in only_tmp)  # dropped from the KV store ...
    cat = Catalog(served.store)
    entries = {k for k, _ in cat.cache_entries()}
    cat.close()
    assert not (only_tmp & entries) and both <= entries  # ... and from the catalog; the shared ones stay
    assert all(k in kv for k in both)


def test_error_paths_leak_no_server_path(served, monkeypatch):
    h = served.http
    checks = [
        (ask(served, "nope"), 404, "collection_not_found"),
        (ask(served, "../etc"), 400, None),
        (h.get("/v1/documents", params={"collection": "a/b"}), 400, None),
        (h.delete("/v1/documents/nope", params={"collection": "red"}), 404, "document_not_found"),
        (h.delete("/v1/documents/../x"), 404, "not_found"),
        (h.post("/v1/documents", json={"name": "e.txt", "text": "   "}), 400, None),
        (
            h.post("/v1/documents", content=b"{not json", headers={"Content-Type": "application/json"}),
            400,
            None,
        ),
        (h.post("/v1/documents", content=b"x" * 200_000), 413, "body_too_large"),
        (h.post("/v1/documents", files={"nofile": ("a", b"a")}), 400, None),
        (
            h.post(
                "/v1/documents", content=b"--x\r\nbroken", headers={"Content-Type": "multipart/form-data"}
            ),
            400,
            None,
        ),
        (h.post("/v1/collections", json={"name": "bad name"}), 400, None),
        (h.put("/v1/collections"), 405, "method_not_allowed"),
        (h.get("/v1/nothing"), 404, "not_found"),
        (h.get("/v1/models", headers={"Authorization": "Bearer wrong"}), 401, "invalid_api_key"),
        (h.get("/metrics"), 401, "invalid_api_key"),
        (ask(served, "red", question="x " * 5000), 400, "context_length_exceeded"),
    ]
    # the store is busy: another writer holds its lock (the message names the store: scrubbed)
    cat = Catalog(served.store)
    with cat.write_lock():
        checks.append(
            (h.post("/v1/documents", json={"name": "b.txt", "text": "busy", "collection": "red"}), 409, None)
        )
    cat.close()

    # an unexpected failure whose message holds the path: a bare 500, no detail, no stack trace
    def broken(*_a, **_k):
        raise RuntimeError(f"boom in {served.store}")

    monkeypatch.setattr(served.backend.documents, "list", broken)
    checks.append((h.get("/v1/documents"), 500, None))
    # the store cannot be written (disk full): 507, the store's path only in the server's log
    from turborag.rag import ingest

    def full(self, *_a, **_k):
        raise ingest.StoreWriteError(f"could not write the store at {served.store} (No space left on device)")

    monkeypatch.setattr(ingest.Ingestor, "run", full)
    checks.append(
        (h.post("/v1/documents", json={"name": "f.txt", "text": "full"}), 507, "store_write_failed")
    )

    # a request error whose message names the store: the path is scrubbed
    def bad_search(*_a, **_k):
        raise ValueError(f"cannot read {served.store.resolve()}/index.safetensors")

    monkeypatch.setattr(served.backend.retriever, "search", bad_search)
    checks.append((ask(served, "red"), 400, None))
    bad_model = {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}
    checks.append((h.post("/v1/chat/completions", json=bad_model), 404, "model_not_found"))
    for r, status, code in checks:
        assert r.status_code == status, (r.request.url, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and (code is None or err["code"] == code)
    busy = next(r for r, status, _ in checks if status == 409).json()["error"]["message"]
    assert "<store>" in busy and "another turborag process" in busy
    scrubbed = checks[-2][0].json()["error"]["message"]
    assert scrubbed.startswith("cannot read <store>")
    assert served.http.get("/health").status_code == 200  # open, no key needed
    ok = httpx.get(served.url + "/metrics", headers={"Authorization": "Bearer m-key"})
    assert ok.status_code == 200 and "turborag" in ok.text


def test_no_response_body_contains_the_store_path(served):
    """Runs last in this module: every body every test here received."""
    paths = {str(served.store), str(served.store.resolve()), str(served.store.parent)}
    assert len(served.bodies) > 40
    for body in served.bodies:
        assert not any(p in body for p in paths), body[:300]
        assert "Traceback" not in body
