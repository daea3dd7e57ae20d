"""Errors in OpenAI's shape, request bodies parsed into them, and the middleware every request passes.

OpenAI clients read `{"error": {"message", "type", "param", "code"}}`; FastAPI's own validation errors
(`{"detail": [...]}`) would reach them as unreadable failures. So bodies are parsed here, not by FastAPI,
and the guard middleware turns anything that escapes a route into that shape, never into a stack trace.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)


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
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def too_large(max_bytes: int, what: str = "request body") -> APIError:
    return APIError(413, f"{what} over {max_bytes} bytes", code="body_too_large")


def validation_message(e: ValidationError) -> tuple[str, str | None]:
    """(message, param) of a validation error's first problem: OpenAI's body has room for one."""
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    return f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")), loc or None


async def parse_body(request: Request, model: type[BaseModel], max_bytes: int) -> Any:
    """The request's JSON body validated as `model`. The size is checked again on the bytes read, since a
    chunked request has no Content-Length for the guard to check."""
    raw = await request.body()
    if len(raw) > max_bytes:
        raise too_large(max_bytes)
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


def check_request(request: Request, api_key: str | None, max_body_bytes: int) -> None:
    """Refuse a declared-too-large body before it is read, and a missing or wrong key on the API (`/v1/`);
    `/health` and `/metrics` stay open for probes and scrapers."""
    length = request.headers.get("content-length")
    if length is not None and int(length) > max_body_bytes:
        raise too_large(max_body_bytes)
    if api_key and request.url.path.startswith("/v1/"):
        if request.headers.get("authorization", "") != f"Bearer {api_key}":
            raise APIError(401, "missing or wrong API key", "authentication_error", "invalid_api_key")


async def guard(request: Request, call_next):
    """HTTP middleware: body size, API key and uniform error bodies for every endpoint; counts requests."""
    state = request.app.state.server  # a turborag.serve.state.ServerState (not imported: it imports this)
    endpoint = request.url.path
    try:
        check_request(request, state.api_key, state.max_body_bytes)
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
