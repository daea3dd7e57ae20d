"""The web page arrives with its document list in it (escaped), so that it is not empty before app.js has
fetched `/v1/documents`; a server that needs a key shows "Loading documents…" instead of listing them to
anyone who loads the page. A plain HTTP GET, no browser."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from turborag.bench.serve import ServedApp
from turborag.cli import app
from turborag.cli.serve import served_for
from turborag.serve import Served, create_app
from turborag.serve.page_routes import LOADING

NAME = "minutes <b>&amp; notes.md"  # a real file name: HTML in it must reach the page as text


@pytest.fixture(scope="module")
def backend(tmp_path_factory, tiny_model_dir):
    home = tmp_path_factory.mktemp("page-docs")
    mp = pytest.MonkeyPatch()
    mp.setenv("TURBORAG_HOME", str(home / "home"))
    (home / "docs").mkdir()
    (home / "docs" / NAME).write_text("The harbour master rings a brass bell at six.\n")
    store = home / "store"
    args = ["ingest", str(home / "docs"), "--store", str(store), "--model", tiny_model_dir]
    r = CliRunner().invoke(app, [*args, "--chunk-tokens", "64"])
    assert r.exit_code == 0, r.output
    yield served_for(store, None, "cpu", 8)
    mp.undo()


def _page(the_app) -> str:
    with ServedApp(the_app) as srv:
        r = httpx.get(srv.url + "/", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    return r.text


def test_an_open_server_puts_the_documents_in_the_page_escaped(backend):
    page = _page(create_app(backend))
    assert "minutes &lt;b&gt;&amp;amp; notes.md" in page and "<b>" not in page
    assert "1 chunk<" in page and LOADING not in page
    assert '<script src="/static/app.js"' in page  # the rest of the page as it was


def test_a_server_with_a_key_lists_nothing_before_the_key(backend):
    page = _page(create_app(backend, api_key="sk-page"))
    assert LOADING in page and "minutes" not in page


def test_a_server_without_a_store_has_no_loading_line(backend):
    page = _page(create_app(Served(backend.engine, "tiny")))  # the same tiny model, no store
    assert '<ul id="doc-list"></ul>' in page
