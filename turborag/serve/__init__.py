"""The OpenAI-compatible HTTP server over the engine; `create_app` builds it (see app.py).

`create_app` and `Served` are imported on first use (PEP 562), so that a light module of this package
(`access`, for `turborag keys`) can be imported without FastAPI and torch."""

from __future__ import annotations

__all__ = ["Served", "create_app"]


def __getattr__(name: str):
    if name == "create_app":
        from turborag.serve.app import create_app

        return create_app
    if name == "Served":
        from turborag.serve.state import Served

        return Served
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
