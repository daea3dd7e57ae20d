"""The upload journal: which uploads are being ingested, so that one cut short by a crash is rolled back.

An upload is written to `<store>/uploads/<id>/` and ingested batch by batch: caches are stored as each
forward batch ends and documents are committed a group at a time. A server killed in between leaves a
partial upload that no client was told about. Before its folder is written, the server puts a marker beside
it, `<store>/uploads/<id>.ingesting` (its host, process id and collection), and removes the marker once the
upload is committed or taken back. A marker whose process is gone (same host, no such process) names an
interrupted upload: `recover` removes its documents, its folder and the marker, then the cache files that
no collection names (the uncommitted batches' among them). The server runs it at start and `turborag cache
gc` runs it; both hold the catalog's write lock, so no ingest is under way.

A marker from another host (a replica sharing the store) is left to that host's own restart.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".ingesting"


def marker(folder: Path) -> Path:
    return folder.with_name(folder.name + SUFFIX)


def begin(folder: Path, collection: str) -> None:
    """Mark `folder` (not written yet) as an upload being ingested by this process."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    record = {"host": socket.gethostname(), "pid": os.getpid(), "collection": collection}
    tmp = marker(folder).with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, marker(folder))  # a marker is whole or absent


def end(folder: Path) -> None:
    """The upload is committed or taken back: nothing to recover."""
    marker(folder).unlink(missing_ok=True)


def _alive(record: dict) -> bool:
    if record.get("host") != socket.gethostname():
        return True  # another machine's: its own restart recovers it
    try:
        os.kill(int(record["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, ValueError, TypeError):
        return True
    return True


def interrupted(uploads: Path) -> list[tuple[Path, str]]:
    """(folder, collection) of every upload whose ingesting process is gone."""
    found = []
    for m in sorted(uploads.glob(f"*{SUFFIX}")) if uploads.is_dir() else []:
        try:
            record = json.loads(m.read_text())
        except (OSError, ValueError):
            record = {"host": socket.gethostname(), "pid": -1}  # cut short while written: its writer is gone
        if not _alive(record):
            found.append((m.with_name(m.name.removesuffix(SUFFIX)), str(record.get("collection", "default"))))
    return found


@dataclass
class Recovered:
    uploads: int = 0  # interrupted uploads rolled back
    files: int = 0  # files removed (upload files and cache files)
    bytes: int = 0


def recover(catalog, kv) -> Recovered:
    """Roll back every interrupted upload of the store (see the module). The caller holds the catalog's
    write lock. A shared store that cannot be reached keeps its cache files for a later `cache gc`."""
    from turborag.rag.ingest import free_caches
    from turborag.store.catalog import StoreError
    from turborag.store.errors import StoreUnavailable

    out = Recovered()
    found = interrupted(catalog.root / "uploads")
    for folder, collection in found:
        try:
            view = catalog.use(collection)
        except StoreError:  # the collection was deleted since: its documents went with it
            view = None
        if view is not None:
            view.remove_documents(view.documents_under(str(folder.resolve())))
        if folder.is_dir():
            files = [f for f in folder.rglob("*") if f.is_file()]
            out.files += len(files)
            out.bytes += sum(f.stat().st_size for f in files)
            shutil.rmtree(folder, ignore_errors=True)
        end(folder)
        out.uploads += 1
    if found:
        try:
            out.bytes += free_caches(catalog, kv)
            known = {k for k, _ in catalog.cache_entries()}
            for key in [k for k in kv.keys() if k not in known]:
                out.bytes += kv.delete(key)
                out.files += 1
        except StoreUnavailable:
            pass
    return out
