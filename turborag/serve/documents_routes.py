"""Document management: `POST /v1/documents` (JSON `{"name", "text"}` or a multipart `file`),
`GET /v1/documents`, `DELETE /v1/documents/{id}`; a 404 `no_store` on a server without a store.

Uploads are written under the store's own `uploads/` folder with a server-chosen name: a client never
names a server path. The store's work (ingest, catalog reads) runs on the model worker thread, which owns
the catalog's SQLite connection and the model that ingest needs.
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from turborag.serve.errors import APIError, parse_body, too_large
from turborag.serve.schemas import DocumentRequest
from turborag.serve.state import StateDep

router = APIRouter()


@router.post("/v1/documents")
async def add_document(request: Request, state: StateDep):
    docs = state.documents()
    name, data = await read_upload(request, state.max_body_bytes)
    name = safe_name(name)
    added = await state.call(lambda: docs.add(name, data))
    return JSONResponse(added, status_code=201)


@router.get("/v1/documents")
async def list_documents(state: StateDep):
    docs = state.documents()
    return {"object": "list", "data": await state.call(docs.list)}


@router.delete("/v1/documents/{doc_id}")
async def delete_document(doc_id: str, state: StateDep):
    docs = state.documents()
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", doc_id):
        raise APIError(400, "malformed document id", param="doc_id")
    if not await state.call(lambda: docs.delete(doc_id)):
        raise APIError(404, f"no document {doc_id!r}", code="document_not_found")
    return {"id": doc_id, "object": "document", "deleted": True}


async def read_upload(request: Request, max_bytes: int) -> tuple[str, bytes]:
    """(client's file name, content) of a multipart `file` field or a JSON document body."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        req: DocumentRequest = await parse_body(request, DocumentRequest, max_bytes)
        return req.name, req.text.encode("utf-8")
    form = await request.form()
    upload = form.get("file")
    if upload is None or not hasattr(upload, "read"):
        raise APIError(400, "multipart upload needs a 'file' field", param="file")
    data = await upload.read()
    if len(data) > max_bytes:
        raise too_large(max_bytes, "file")
    return upload.filename or "upload.txt", data


def safe_name(name: str) -> str:
    """A file name a client may not use to reach outside the uploads folder: no separators, no dot-files."""
    base = Path(name.replace("\\", "/")).name
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".") or "upload.txt"
    return base[:100]
