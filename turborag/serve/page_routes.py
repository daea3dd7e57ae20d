"""The web page: `GET /` (index.html) and its two assets, `GET /static/style.css` and `GET /static/app.js`.

Plain files shipped in the package (`turborag/serve/static/`, read with importlib.resources): no build step,
no CDN, so the page works offline. Loading the page needs no key (the guard asks for one on `/v1/` only);
the page's API calls carry the key, which it asks for on the first 401.

The page arrives with its document list already in it (`render_documents`), so that it is not empty until
app.js has fetched `/v1/documents`; app.js then replaces the list with the same items, wired. The list is
rendered only when the request could read it from the API without a key; otherwise, and when the model
worker is too busy to list it at once, the page keeps the "Loading documents…" line of index.html.

One route per file rather than `/static/{name}`: a scanner's made-up file names then get the plain 404 and
are counted under the one `unmatched` metrics label instead of opening a series each.
"""

from __future__ import annotations

import asyncio
import html
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import Response

from turborag.serve.errors import APIError

router = APIRouter()

FILES = {  # URL path -> (file in turborag/serve/static, media type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
}
HEADERS = {"Cache-Control": "no-cache"}  # revalidate, so a server upgrade is seen on the next load
LOADING = '<li class="muted">Loading documents…</li>'  # index.html's list until the documents are known
LIST_TIMEOUT_S = 0.5  # the list is read on the model worker: a page never waits on an ingest for it
COLLECTION = "default"  # the collection the page opens on (app.js: the select's value, else `default`)


def _read(file: str) -> bytes:
    return resources.files("turborag.serve").joinpath("static", file).read_bytes()


def _route(file: str, media_type: str):
    async def page():
        return Response(_read(file), media_type=media_type, headers=HEADERS)

    return page


def render_documents(docs: list[dict]) -> str:
    """The `<li>` items app.js's `loadDocuments` builds, as HTML; every value from the store is escaped.
    The Remove buttons are disabled until app.js replaces the list with wired ones."""
    if not docs:
        return '<li class="muted">No documents yet.</li>'
    items = []
    for doc in docs:
        n = int(doc["chunks"])
        items.append(
            f'<li data-id="{html.escape(str(doc["id"]))}">'
            f'<span class="doc-name">{html.escape(str(doc["name"]))}</span>'
            f'<span class="muted">{n} chunk{"" if n == 1 else "s"}</span>'
            '<button class="secondary remove" disabled>Remove</button></li>'
        )
    return "".join(items)


async def initial_documents(request: Request) -> str | None:
    """The page's document list as HTML, or None to leave the loading line: no store (app.js says so), a
    key needed to read it (the page is served without one), or a worker too busy to answer at once."""
    state = request.app.state.server
    docs = state.served.documents
    if docs is None:
        return ""
    if not state.principal(request).can_read(COLLECTION):
        return None
    try:
        listed = await asyncio.wait_for(state.call(lambda: docs.list(COLLECTION)), LIST_TIMEOUT_S)
    except (TimeoutError, asyncio.TimeoutError, APIError):  # asyncio's is not the builtin before 3.11
        return None
    return render_documents(listed)


@router.get("/", include_in_schema=False)
async def index(request: Request) -> Response:
    page = _read("index.html").decode("utf-8")
    items = await initial_documents(request)
    if items is not None:
        page = page.replace(LOADING, items, 1)
    return Response(page, media_type=FILES["/"][1], headers=HEADERS)


for _path, (_file, _media) in FILES.items():
    if _path != "/":
        router.add_api_route(_path, _route(_file, _media), methods=["GET"], include_in_schema=False)
