"""`ingest --isolate-collections`: chunk caches keyed per collection. The same text in two collections is
cached twice, a request's own passages are looked up in its collection only (so sending another collection's
exact text is computed like any new text: the timing channel is closed), the store opens again with its keys
checked, and a store that shares its caches refuses the option."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from turborag.bench.serve import ServedApp
from turborag.cli import app
from turborag.cli.serve import served_for
from turborag.serve import create_app

KEY = "sk-admin"
RED = "# Lighthouse\n\nThe lighthouse of Velmora is painted red and its keeper is called Odrun Pask.\n"
BLUE = "# Lighthouse\n\nThe lighthouse of Velmora is painted blue and its keeper is called Mirel Tosk.\n"


def _ingest(store, docs, collection: str, model: str, *more: str):
    folder = docs / collection
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{collection}.md").write_text(RED if collection == "red" else BLUE)
    args = ["ingest", str(folder), "--store", str(store), "--collection", collection, "--model", model]
    return CliRunner().invoke(app, [*args, "--chunk-tokens", "64", *more])


@pytest.fixture(scope="module", params=["per-collection", "shared"])
def served(request, tmp_path_factory, tiny_model_dir):
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("TURBORAG_HOME", str(home))
    store = home / "store"
    flag = ["--isolate-collections"] if request.param == "per-collection" else []
    for name in ("red", "blue"):
        r = _ingest(store, home / "docs", name, tiny_model_dir, *flag)
        assert r.exit_code == 0, r.output
    backend = served_for(store, None, "cpu", 4)  # opens the store again: its keys are checked
    with ServedApp(create_app(backend, api_key=KEY)) as srv:
        srv.keys, srv.backend = request.param, backend
        srv.http = httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
        yield srv
        srv.http.close()
    mp.undo()


def _chat(srv, collection: str, **more) -> dict:
    body = {"model": "turborag", "messages": [{"role": "user", "content": "What colour?"}], "max_tokens": 2}
    r = srv.http.post("/v1/chat/completions", json={**body, "turborag": {"collection": collection, **more}})
    assert r.status_code == 200, r.text
    return r.json()["turborag"]


def test_another_collections_exact_text_is_computed_like_a_new_one(served):
    assert served.backend.engine.isolate_collections == (served.keys == "per-collection")
    red_chunks = [c["text"] for c in _chat(served, "red", top_k=3)["chunks"]]
    assert red_chunks
    guess = _chat(served, "blue", contexts=red_chunks, mode="turbo")
    # shared: red's caches answer blue's guess at once (the channel); isolated: computed, as new text is
    expected = len(red_chunks) if served.keys == "per-collection" else 0
    assert guess["computed_chunks"] == expected
    assert _chat(served, "red", contexts=red_chunks, mode="turbo")["computed_chunks"] == 0


def test_the_same_text_in_two_collections_is_cached_per_collection(served):
    store = served.backend.engine.store
    h = served.http
    h.post("/v1/collections", json={"name": "copy"})
    text = "The quiblet bird nests only in copper towers, and it sings at dusk."
    before = set(store.keys())
    for collection in ("red", "copy"):
        r = h.post("/v1/documents", json={"name": "birds.txt", "text": text, "collection": collection})
        assert r.status_code == 201, r.text
    added = len(set(store.keys()) - before)
    one = r.json()["chunks"]
    assert added == (2 * one if served.keys == "per-collection" else one)


def test_a_shared_store_refuses_isolation_later(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    store = tmp_path / "store"
    assert _ingest(store, tmp_path / "docs", "red", tiny_model_dir).exit_code == 0
    r = _ingest(store, tmp_path / "docs", "blue", tiny_model_dir, "--isolate-collections")
    assert r.exit_code != 0 and "shares its caches across collections" in r.output
