"""Errors of the store layer that callers catch, importable without any optional backend package."""

from __future__ import annotations


class StoreUnavailable(Exception):
    """A remote store cannot be reached (refused, timed out, cluster down). The message is one line that
    names the store (its URL, without password) and why; no operation ever hangs instead of raising this.

    A cache that cannot be reached is a cache miss for the caller that can recompute, and an error to report
    for one that cannot (`cache verify`, `cache gc`)."""
