"""Collections: `GET /v1/collections`, `POST /v1/collections` (`{"name"}`), `DELETE /v1/collections/{name}`.

A store holds named collections of documents; retrieval never crosses them, and chunk caches stay shared
underneath (the same text in two collections is computed and stored once). A key lists the collections it
may read or write, creates and deletes those it may write. `default` always exists (the collection of the
command line's `turborag ingest` without `--collection`) and is not deleted.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from turborag.serve.documents_routes import check_collection
from turborag.serve.errors import APIError, parse_body
from turborag.serve.schemas import CollectionRequest
from turborag.serve.state import StateDep

router = APIRouter()


@router.get("/v1/collections")
async def list_collections(request: Request, state: StateDep):
    docs = state.documents()
    principal = state.principal(request)
    found = await state.call(docs.collections)
    return {"object": "list", "data": [c for c in found if principal.sees(c["id"])]}


@router.post("/v1/collections")
async def create_collection(request: Request, state: StateDep):
    docs = state.documents()
    req: CollectionRequest = await parse_body(request, CollectionRequest, state.max_body_bytes)
    state.may_write(request, req.name)
    if not await state.call(lambda: docs.create_collection(req.name)):
        raise APIError(409, f"collection {req.name!r} already exists", code="collection_exists", param="name")
    body = {"id": req.name, "object": "collection", "documents": 0, "chunks": 0, "tokens": 0}
    return JSONResponse(body, status_code=201)


@router.delete("/v1/collections/{name}")
async def delete_collection(name: str, request: Request, state: StateDep):
    docs = state.documents()
    check_collection(name)
    state.may_write(request, name)
    if name == "default":
        raise APIError(400, "the default collection cannot be deleted", param="name")
    if not await state.call(lambda: docs.delete_collection(name)):
        raise APIError(404, f"no collection {name!r}", code="collection_not_found", param="name")
    return {"id": name, "object": "collection", "deleted": True}
