"""The core layer's exceptions, importable without torch (a command reports them without loading it)."""

from __future__ import annotations


class ModelError(Exception):
    """A model that cannot be loaded or used for cache reuse; the message says why."""
