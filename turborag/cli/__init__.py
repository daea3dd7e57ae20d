"""The `turborag` command line: one module per command group, assembled in `app.py`."""

from turborag.cli.app import app, main

__all__ = ["app", "main"]
