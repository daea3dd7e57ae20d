"""`GET /health` (liveness, queue depth, whether documents are served) and `GET /metrics` (Prometheus).

Both are outside `/v1/`, so no API key opens them: `/health` stays open for probes, and `/metrics` needs the
metrics key when the server was started with one (`--metrics-key`; errors.check_request checks it).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from turborag.serve.state import StateDep

router = APIRouter()


@router.get("/health")
async def health(state: StateDep):
    return {
        "status": "ok",
        "model": state.served.model_name,
        "queue_depth": state.worker.depth,
        "documents": state.served.documents is not None,
    }


@router.get("/metrics")
async def prometheus(state: StateDep):
    text = state.metrics.exposition(state.worker, state.engine)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
