"""The web page: `GET /` (index.html) and its two assets, `GET /static/style.css` and `GET /static/app.js`.

Plain files shipped in the package (`turborag/serve/static/`, read with importlib.resources): no build step,
no CDN, so the page works offline. Loading the page needs no key (the guard asks for one on `/v1/` only);
the page's API calls carry the key, which it asks for on the first 401.

One route per file rather than `/static/{name}`: a scanner's made-up file names then get the plain 404 and
are counted under the one `unmatched` metrics label instead of opening a series each.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter()

FILES = {  # URL path -> (file in turborag/serve/static, media type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
}
HEADERS = {"Cache-Control": "no-cache"}  # revalidate, so a server upgrade is seen on the next load


def _route(file: str, media_type: str):
    async def page():
        data = resources.files("turborag.serve").joinpath("static", file).read_bytes()
        return Response(data, media_type=media_type, headers=HEADERS)

    return page


for _path, (_file, _media) in FILES.items():
    router.add_api_route(_path, _route(_file, _media), methods=["GET"], include_in_schema=False)
