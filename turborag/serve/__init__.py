"""The OpenAI-compatible HTTP server over the engine; `create_app` builds it (see app.py)."""

from turborag.serve.app import create_app
from turborag.serve.state import Backend

__all__ = ["Backend", "create_app"]
