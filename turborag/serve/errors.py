"""Errors in OpenAI's shape, request bodies parsed into them, and the middleware every request passes.

OpenAI clients read `{"error": {"message", "type", "param", "code"}}`; FastAPI's own validation errors
(`{"detail": [...]}`) would reach them as unreadable failures. So bodies are parsed here, not by FastAPI,
and the guard middleware turns anything that escapes a route into that shape, never into a stack trace.
A JSON body must be declared `Content-Type: application/json` (415 otherwise; origin.py says why).
The errors that routing itself raises (a wrong path: 404, a wrong method: 405) are Starlette
`HTTPException`s answered before any route runs; `http_error_handler` gives them that shape too.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.routing import Match

from turborag.serve.access import check_secret

log = logging.getLogger(__name__)

UNMATCHED = "unmatched"  # the metrics label of every request to a path that no route serves

# Codes whose message is for the server's log only; the client gets the fixed text instead. A shared
# store's error names its host, port and URL, which a client has no use for and an attacker would.
LOG_ONLY = {"store_unavailable": "the shared cache store is unavailable; retry shortly"}


class APIError(Exception):
    """An HTTP error a route raises; becomes an OpenAI error body with `status` and `headers`."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict | None = None,
    ):
        if code in LOG_ONLY:
            log.warning("%d %s: %s", status, code, message)
            message = LOG_ONLY[code]
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers = headers or {}

    def body(self) -> dict:
        """The inside of OpenAI's `{"error": ...}`."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.body()}, status_code=self.status, headers=self.headers)


def forbidden(message: str) -> APIError:
    """403 in OpenAI's shape: the key is valid but its scope does not cover what was asked."""
    return APIError(403, message, "permission_error", "permission_denied")


def too_large(max_bytes: int, what: str = "request body") -> APIError:
    return APIError(413, f"{what} over {max_bytes} bytes", code="body_too_large")


def validation_message(e: ValidationError) -> tuple[str, str | None]:
    """(message, param) of a validation error's first problem: OpenAI's body has room for one."""
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    msg = str(err.get("msg")).removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
    return f"{loc}: {msg}" if loc else msg, loc or None


def check_json_type(request: Request) -> None:
    """415 unless the body is declared `application/json`. A browser sends a cross-origin body without a
    CORS preflight only as a form or `text/plain`; requiring the JSON type keeps those out of the API."""
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        raise APIError(
            415,
            f"Content-Type must be application/json, not {media[:80] or 'missing'!r}",
            code="unsupported_media_type",
        )


async def parse_body(request: Request, model: type[BaseModel], max_bytes: int) -> Any:
    """The request's JSON body validated as `model`. The size is checked again on the bytes read, since a
    chunked request has no Content-Length for the guard to check. Decoding and validating run off the event
    loop: a body of many messages takes seconds of CPU, during which no other request (`/health` included)
    would be answered."""
    check_json_type(request)
    raw = await request.body()
    if len(raw) > max_bytes:
        raise too_large(max_bytes)
    return await asyncio.to_thread(parse_json, raw, model)


def parse_json(raw: bytes, model: type[BaseModel]) -> Any:
    """`raw` decoded as a JSON object and validated as `model`; a 400 in OpenAI's shape if it is not."""
    try:
        data = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise APIError(400, "request body is not valid JSON", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        msg, param = validation_message(e)
        raise APIError(400, msg, param=param, code="invalid_value") from None


def check_request(request: Request, state: Any) -> None:
    """Refuse a declared-too-large body before it is read, and a missing or unknown key on the API (`/v1/`),
    where the key's principal (its scopes) is put on `request.state.principal` for the routes. `/metrics`
    needs the metrics key when the server has one; `/health` stays open for probes."""
    length = request.headers.get("content-length")
    if length is not None and not length.strip().isdigit():
        raise APIError(400, "malformed Content-Length header", code="invalid_request")
    if length is not None and int(length) > state.max_body_bytes:
        raise too_large(state.max_body_bytes)
    auth = request.headers.get("authorization", "")
    if request.url.path.startswith("/v1/"):
        principal = state.access.authenticate(auth)
        if principal is None:
            raise APIError(401, "missing or wrong API key", "authentication_error", "invalid_api_key")
        request.state.principal = principal
    elif request.url.path == "/metrics" and state.metrics_key and not check_secret(auth, state.metrics_key):
        raise APIError(401, "missing or wrong metrics key", "authentication_error", "invalid_api_key")


async def guard(request: Request, call_next):
    """HTTP middleware: body size, API key and uniform error bodies for every endpoint; counts requests."""
    state = request.app.state.server  # a turborag.serve.state.ServerState (not imported: it imports this)
    endpoint = endpoint_label(request)
    try:
        check_request(request, state)
        response = await call_next(request)
    except APIError as e:
        response = e.response()
    except Exception:  # never a stack trace in a response
        log.exception("internal error on %s", endpoint)
        response = APIError(500, "internal server error", "server_error").response()
    state.metrics.count_request(endpoint, response.status_code)
    return response


async def api_error_handler(_request: Request, e: APIError) -> JSONResponse:
    """Exception handler: an APIError raised in a route becomes its error body right there, rather than
    travelling back up through the guard's `call_next` as an exception."""
    return e.response()


def endpoint_label(request: Request) -> str:
    """The label a request is counted under: the template of the route that serves its path, e.g.
    `/v1/collections/{name}` (a route of another method if none of this one: a 405), else one shared label.
    Never the raw path: it is the client's string, and counted before authentication, so made-up names
    would each open a Prometheus series and show in `/metrics`."""
    partial = None
    for route in _leaf_routes(request.app.router.routes):
        match = route.matches(request.scope)[0]
        if match is Match.FULL:
            return getattr(route, "path", UNMATCHED)
        if match is Match.PARTIAL and partial is None:
            partial = getattr(route, "path", UNMATCHED)
    return partial or UNMATCHED


def _leaf_routes(routes: list) -> Iterator[Any]:
    """The routes that each serve one path template. Newer FastAPI keeps an included router as one entry
    (its routes under `original_router`) that matches without saying which of its routes did."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _leaf_routes(inner.routes)
        else:
            yield route


def endpoints(request: Request) -> list[str]:
    """`METHOD /path` of every documented route, for a 404 to point the client at. Read from the OpenAPI
    schema (built once, then cached by FastAPI), the public list of what the app serves."""
    paths = request.app.openapi().get("paths", {})
    return [f"{method.upper()} {path}" for path, ops in paths.items() for method in ops]


async def http_error_handler(request: Request, e: HTTPException) -> Response:
    """Exception handler for Starlette's HTTPException (routing's 404 and 405, and any other raised): OpenAI's
    shape, with the status and headers (405's `Allow`) kept. The message says what was asked for and what
    would have worked, which a client's error message then shows instead of a bare "Not Found"."""
    what = f"{request.method} {request.url.path}"
    if e.status_code in (204, 304):  # statuses that carry no body
        return Response(status_code=e.status_code, headers=e.headers)
    # raised bare, as routing raises them; a 404 or 405 with its own detail keeps it
    routing = e.status_code in (404, 405) and e.detail == HTTPStatus(e.status_code).phrase
    if e.status_code == 404 and routing:
        message = f"Invalid URL ({what}): no such endpoint; this server has {', '.join(endpoints(request))}"
        code = "not_found"
    elif e.status_code == 405 and routing:
        allow = (e.headers or {}).get("Allow", "")
        message, code = f"{what} is not allowed; use {allow or 'another method'}", "method_not_allowed"
    else:  # Starlette fills a missing detail with the status phrase; FastAPI's may be any JSON value
        detail = e.detail if isinstance(e.detail, str) else json.dumps(e.detail, default=str)
        message, code = detail or what, None
    type_ = "invalid_request_error"
    if e.status_code == 401:
        type_ = "authentication_error"
    elif e.status_code == 403:
        type_ = "permission_error"
    elif e.status_code >= 500:
        type_ = "server_error"
    return APIError(e.status_code, message, type_, code, headers=dict(e.headers or {})).response()
