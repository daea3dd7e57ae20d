"""File digests and small JSON indexes kept under $TURBORAG_HOME/models/, remembered across processes.

A cold start must not redo work whose inputs have not changed: hashing the default model's 250 MB GGUF took
0.7 s of every start, and checking a tokenizer's fast path (core/tokenizer.py) takes seconds. Both results
are remembered in JSON files here, keyed by what they depend on, written atomically (temp file + rename) and
simply recomputed when the file is missing, damaged or the home is read-only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from turborag.core.defaults import turborag_home


def index_path(name: str) -> Path:
    return turborag_home() / "models" / name


def read_index(name: str) -> dict:
    """The JSON object in models/<name>, or {} if it is missing or unreadable."""
    try:
        index = json.loads(index_path(name).read_text())
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}


def write_index(name: str, index: dict) -> None:
    """Replace models/<name> atomically; a read-only home only means the work is redone next time."""
    path = index_path(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.json")
        tmp.write_text(json.dumps(index))
        os.replace(tmp, path)
    except OSError:
        pass


def write_json(path: Path, obj: dict) -> None:
    """`obj` as indented JSON at `path`, through a temp file beside it and one rename: a crash leaves the
    old file or none, never half of one (a record a later run or the engine reads back)."""
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def sha256_file(path: Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def file_digest(path: Path) -> str:
    """sha256 of a file, remembered by (path, size, mtime) in models/digests.json."""
    st = path.stat()
    key, stamp = str(path.resolve()), [st.st_size, st.st_mtime_ns]
    index = read_index("digests.json")
    entry = index.get(key)
    if isinstance(entry, dict) and entry.get("stamp") == stamp:
        return entry["sha256"]
    digest = sha256_file(path)
    index[key] = {"stamp": stamp, "sha256": digest}
    write_index("digests.json", index)
    return digest
