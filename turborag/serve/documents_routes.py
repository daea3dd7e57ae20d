"""Document management: `POST /v1/documents` (JSON `{"name", "text", "collection"}` or a multipart `file`
and `collection`), `GET /v1/documents`, `DELETE /v1/documents/{id}`; a 404 `no_store` on a server without a
store. Each works on one collection: the body's `collection`, else the query's `?collection=`, else
`default`; the request's key must be allowed to write it (upload, delete) or read it (list).

Uploads are written under the store's own `uploads/` folder with a server-chosen name: a client never
names a server path. The store's work (ingest, catalog reads) runs on the model worker thread, which owns
the catalog's SQLite connection and the model that ingest needs.
"""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from turborag.serve.errors import APIError, parse_body, too_large
from turborag.serve.schemas import COLLECTION_PATTERN, DocumentRequest
from turborag.serve.state import StateDep, client_left
from turborag.serve.turns import InTurns

router = APIRouter()


@router.post("/v1/documents")
async def add_document(request: Request, state: StateDep):
    docs = state.documents()
    name, data, collection = await read_upload(request, state.max_body_bytes)
    collection = collection or query_collection(request)
    state.may_write(request, collection)
    name = safe_name(name)
    cancelled = threading.Event()  # set if the client leaves: the ingest stops and takes itself back
    watcher = asyncio.ensure_future(_set_when_gone(request, cancelled))
    try:
        with state.upload_slot(request):
            # one batch of caches at a time, so that other requests are answered while it runs
            ingest = InTurns(lambda turn: docs.add(name, data, collection, cancelled, turn), cancelled)
            added = await state.in_turns(ingest.steps)
    finally:
        watcher.cancel()
    return JSONResponse(added, status_code=201)


async def _set_when_gone(request: Request, cancelled: threading.Event) -> None:
    if await client_left(request):
        cancelled.set()


@router.get("/v1/documents")
async def list_documents(request: Request, state: StateDep):
    docs = state.documents()
    collection = query_collection(request)
    state.may_read(request, collection)
    return {"object": "list", "data": await state.call(lambda: docs.list(collection))}


@router.delete("/v1/documents/{doc_id}")
async def delete_document(doc_id: str, request: Request, state: StateDep):
    docs = state.documents()
    collection = query_collection(request)
    state.may_write(request, collection)
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", doc_id):
        raise APIError(400, "malformed document id", param="doc_id")
    if not await state.call(lambda: docs.delete(doc_id, collection)):
        raise APIError(404, f"no document {doc_id!r} in collection {collection!r}", code="document_not_found")
    return {"id": doc_id, "object": "document", "deleted": True}


def query_collection(request: Request) -> str:
    """The `?collection=` of a request (default `default`), checked like a collection name."""
    return check_collection(request.query_params.get("collection", "default"))


def check_collection(name: str) -> str:
    if not re.fullmatch(COLLECTION_PATTERN, name):
        raise APIError(400, f"invalid collection name {name[:80]!r}", param="collection")
    return name


async def read_upload(request: Request, max_bytes: int) -> tuple[str, bytes, str | None]:
    """(client's file name, content, collection or None) of a multipart `file` field (with an optional
    `collection` field) or a JSON document body."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        req: DocumentRequest = await parse_body(request, DocumentRequest, max_bytes)
        return req.name, req.text.encode("utf-8"), req.collection
    try:
        form = await request.form()
    except Exception:  # a malformed multipart body: the parser's message says nothing useful to a client
        raise APIError(400, "malformed multipart body", code="invalid_request") from None
    upload = form.get("file")
    if upload is None or not hasattr(upload, "read"):
        raise APIError(400, "multipart upload needs a 'file' field", param="file")
    data = await upload.read()
    if len(data) > max_bytes:
        raise too_large(max_bytes, "file")
    collection = form.get("collection")
    if collection is not None:
        collection = check_collection(str(collection))
    return upload.filename or "upload.txt", data, collection


def safe_name(name: str) -> str:
    """A file name a client may not use to reach outside the uploads folder: no separators, no dot-files."""
    base = Path(name.replace("\\", "/")).name
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".") or "upload.txt"
    return base[:100]
