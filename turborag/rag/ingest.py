"""`turborag ingest`: files -> documents -> chunks -> KV caches + embeddings -> catalog; incremental and
resumable.

One pass:
1. Find the files under the given paths; read each one and compare its sha256 with the catalog. An unchanged
   file is not even parsed: nothing is computed for it (its chunks' caches are only checked to exist, and a
   missing one is recomputed: that is how `cache verify` damage gets repaired).
2. Parse changed and new files into documents (a JSONL file holds many). A document whose text did not change
   keeps its chunks; a changed one is re-chunked.
3. Compute the caches of the new chunks in groups of about `group` chunks (a few docs at a time, so small
   documents still share forward batches), embed the chunks, and commit each document to the catalog in its
   own transaction *after* its caches are on disk. Then delete the cache files no chunk refers to any more.
4. Optionally prune documents whose file is gone (without `prune`, count the ones under the given paths, so
   the caller can say they are still searchable); refresh the index snapshot.

Why this is resumable: the engine skips chunks whose cache file already exists and stores each forward batch
as it ends, so after kill -9 a rerun recomputes at most the batch that was in flight; documents committed
before the kill are unchanged files on the rerun, and documents that were not committed are simply redone
(their caches are found on disk). The catalog never names a cache that was not written.

Errors: a disk-full or permission error stops the run with `StoreWriteError`; everything committed before it
stays and the store remains readable.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from turborag.core.engine import Engine
from turborag.rag import loaders
from turborag.rag.chunker import Chunk, Chunker
from turborag.rag.embed import DIM, Embedder, VectorIndex
from turborag.store.catalog import DEFAULT_COLLECTION, Catalog, NewChunk, StoreError
from turborag.store.errors import StoreUnavailable

log = logging.getLogger(__name__)


class RemoteResult(Protocol):
    """What a remote precompute returns (rag/ray_precompute.py RayResult)."""

    bytes: dict[str, int]  # cache key -> stored bytes
    vectors: dict[str, np.ndarray]  # chunk text -> (384,) float32
    computed: int  # caches it computed (the others were stored already)
    computed_tokens: int


INDEX_FILE = "index.safetensors"
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EFBIG}


class StoreWriteError(Exception):
    """Writing the store failed (disk full, permissions); the message says what to do. Nothing committed
    before the failure is lost."""


class IngestInterrupted(KeyboardInterrupt):
    """Ctrl-C during an ingest, with how far it got: `saved` of the `total` chunk caches this run had to
    compute are on disk, and a rerun of the same command skips them (it resumes)."""

    def __init__(self, saved: int, total: int):
        super().__init__(f"{saved} of {total} chunk caches saved")
        self.saved, self.total = saved, total


@dataclass
class IngestResult:
    documents: int = 0  # documents found under the given paths (new, changed and unchanged)
    chunks: int = 0  # their chunks
    new_chunks: int = 0  # chunk ids added to the catalog in this run
    removed_chunks: int = 0  # chunk ids removed (changed or pruned documents)
    # Tokens whose KV this run computed, each new cache once, counted as the prompt holds the chunk
    # ("Passage: <text>\n\n", what the cache covers). The catalog's `tokens` (`cache stats`) count something
    # else: every chunk in the store, its text alone (Chunk.tokens). So a first ingest of N distinct chunks
    # computes the catalog's count plus N times the wrapping's tokens.
    tokens: int = 0
    seconds: float = 0.0
    cache_bytes: int = 0  # bytes of cache files written in this run
    computed_chunks: int = 0  # caches computed (new chunks whose cache was not on disk + repairs)
    # Distinct caches that the collection's chunks did not use before this run, whether computed now or
    # already stored for another collection (caches are shared, content-addressed). What the server reports
    # as an upload's computed chunks: `computed_chunks` would tell one collection's writer that another
    # collection holds the same text.
    new_to_collection: int = 0
    repaired_caches: int = 0  # caches of unchanged chunks that were missing and recomputed
    # New chunks whose cache was in the store already: left by an interrupted run, or another collection's
    found_caches: int = 0
    unchanged_documents: int = 0
    pruned_documents: int = 0
    gone_documents: int = 0  # without prune: documents under the given paths whose file is gone, still kept
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        """The `--json` shape of `turborag ingest`."""
        keys = ("documents", "chunks", "new_chunks", "removed_chunks", "tokens", "seconds", "cache_bytes")
        keys += ("found_caches",)
        return {k: getattr(self, k) for k in keys}


@dataclass
class _Pending:
    doc: loaders.Document
    chunks: list[Chunk]
    keys: list[str]  # cache key of each chunk
    ids: list[list[int]]  # token ids of each chunk as the prompt holds it ("Passage: ..."), as keyed

    @property
    def sizes(self) -> list[int]:
        return [len(i) for i in self.ids]


class Progress:
    """What ingest reports while it computes; the CLI draws a bar from it (chunks, tokens/s, ETA)."""

    def start(self, chunks: int, tokens: int) -> None: ...

    def advance(self, chunks: int, tokens: int) -> None: ...

    def stop(self) -> None: ...


def _write_error(e: BaseException, root: Path) -> StoreWriteError | None:
    if isinstance(e, sqlite3.OperationalError) and any(
        s in str(e) for s in ("disk is full", "readonly", "unable to open", "disk I/O")
    ):
        reason = str(e)
    elif isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
        reason = f"{os.strerror(e.errno)}" + (f": {e.filename}" if e.filename else "")
    else:
        return None
    if "full" in reason.lower() or (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)):
        todo = (
            f"free some disk space (`turborag cache gc --store {root}` drops unused caches) "
            "and run the same command again to finish"
        )
    else:
        todo = f"make {root} writable (or choose another --store) and run the same command again to finish"
    return StoreWriteError(
        f"could not write the store at {root} ({reason}). Everything ingested before this point is kept and "
        f"the store is readable; {todo}."
    )


class Ingestor:
    def __init__(
        self,
        engine: Engine,
        catalog: Catalog,
        embedder: Embedder,
        chunker: Chunker,
        group: int | None = None,
        progress: Progress | None = None,
        remote: Callable[[list[tuple[str, str, int]]], RemoteResult] | None = None,
    ):
        """`remote`, when given, computes the caches and embeddings of (key, text, tokens) items elsewhere
        (rag/ray_precompute.py: a Ray cluster writing into the shared store); the rest is unchanged."""
        self.remote = remote
        self._vectors: dict[str, np.ndarray] = {}  # chunk text -> vector, from the remote run
        self.engine = engine
        self.catalog = catalog
        self.embedder = embedder
        self.chunker = chunker
        self.group = group or engine.precompute_group  # documents committed once per precompute group
        self.progress = progress or Progress()
        self._todo: dict[str, int] = {}  # cache key -> tokens: the caches this run computes

    def run(self, paths: Sequence[str | Path], prune: bool = False) -> IngestResult:
        """Ingest `paths`. Raises FileNotFoundError (a path does not exist) before writing anything."""
        t0 = time.perf_counter()
        res = IngestResult()
        report = loaders.LoadReport()
        files = loaders.find_files(paths, report)
        try:
            with self.catalog.write_lock():
                pending, repairs = self._scan(files, report, res)
                self._compute(pending, repairs, res)
                if prune:
                    self._prune(paths, files, res)
                else:
                    res.gone_documents = self._gone(paths, files)
                self._free_caches()
                refresh_index(self.catalog)
        except (OSError, sqlite3.OperationalError) as e:
            err = _write_error(e, self.catalog.root)
            if err is None:
                raise
            raise err from e
        except KeyboardInterrupt:
            raise IngestInterrupted(*self._saved()) from None
        finally:
            self.progress.stop()
        res.skipped, res.warnings = report.skipped, report.warnings
        res.seconds = round(time.perf_counter() - t0, 3)
        return res

    def take_back(self) -> int:
        """Delete the caches this run wrote that no chunk of any collection uses: what an upload cancelled
        midway leaves once its documents are removed (each batch is stored as it ends, before its documents
        are committed). Returns how many."""
        written = [k for k in self._todo if k in self.engine.store]
        used = self.catalog.keys_in_use(written)
        orphans = [k for k in written if k not in used]
        for k in orphans:
            self.engine.store.delete(k)
        return len(orphans)

    def _saved(self) -> tuple[int, int]:
        """(caches on disk, caches to compute) of this run: what an interrupted run leaves for the next."""
        return sum(k in self.engine.store for k in self._todo), len(self._todo)

    # -- 1 + 2: what changed ---------------------------------------------------------------------

    def _scan(self, files: list[Path], report: loaders.LoadReport, res: IngestResult):
        pending: list[_Pending] = []
        unchanged_docs: list[str] = []
        for path in files:
            known = self.catalog.documents_by_path(str(path))
            src = loaders.read_source(path, report)
            if src is None:
                continue  # unreadable now: keep what the catalog has (it may be a passing permission issue)
            if known and all(fh == src.file_hash for fh, _ in known.values()):
                unchanged_docs.extend(known)
                continue
            docs = loaders.parse(src, report)
            gone = set(known) - {d.doc_id for d in docs}
            if gone:  # records dropped from a JSONL file, or the file is now empty
                res.removed_chunks += self.catalog.remove_documents(gone)
            for doc in docs:
                old = known.get(doc.doc_id)
                if old and old[1] == doc.content_hash:
                    self.catalog.touch_document(doc.doc_id, doc.file_hash)
                    unchanged_docs.append(doc.doc_id)
                    continue
                chunks = self.chunker.chunk(doc.doc_id, doc.text)
                ids = [self.engine.layout.chunk_ids(c.text) for c in chunks]
                keys = [self.engine.key(i, self.catalog.collection) for i in ids]
                pending.append(_Pending(doc, chunks, keys, ids))
        res.unchanged_documents = len(unchanged_docs)
        res.documents = len(unchanged_docs) + len(pending)
        repairs: list[str] = []  # keys of unchanged chunks whose cache file is missing
        for _doc_id, key, _tokens in self.catalog.cache_keys_of(unchanged_docs):
            res.chunks += 1
            if key not in self.engine.store:
                repairs.append(key)
        res.chunks += sum(len(p.chunks) for p in pending)
        return pending, list(dict.fromkeys(repairs))

    # -- 3: compute, embed, commit ---------------------------------------------------------------

    def _compute(self, pending: list[_Pending], repairs: list[str], res: IngestResult) -> None:
        store = self.engine.store
        keys = {k for p in pending for k in p.keys}
        res.new_to_collection = len(keys - self.catalog.referenced_keys(keys))  # before any commit
        repair = self.catalog.texts_of_keys(repairs) if repairs else {}  # key -> text of a chunk using it
        repair_ids = {k: self.engine.layout.chunk_ids(t) for k, t in repair.items()}
        todo = {k: n for p in pending for k, n in zip(p.keys, p.sizes) if k not in store}
        res.found_caches = len(keys) - len(todo)
        todo.update((k, len(ids)) for k, ids in repair_ids.items())
        self._todo = todo
        self.progress.start(len(todo), sum(todo.values()))
        if self.remote is not None:
            items = [(k, c.text, n) for p in pending for c, k, n in zip(p.chunks, p.keys, p.sizes)]
            items += [(k, t, len(repair_ids[k])) for k, t in repair.items()]
            if items:
                got = self.remote(items)  # caches stored, vectors back: the commits skip both
                self._vectors.update(got.vectors)
                res.computed_chunks += got.computed
                res.tokens += got.computed_tokens
                res.cache_bytes += sum(got.bytes[k] for k in todo if k in got.bytes)
                self.progress.advance(len(todo), sum(todo.values()))

        if repair_ids:
            # Only missing files show here: a damaged one is removed once `cache verify` or a read finds it.
            n = len(repair_ids)
            log.warning(
                "1 chunk cache was missing; recomputing it"
                if n == 1
                else f"{n} chunk caches were missing; recomputing them"
            )
            self._precompute(repair_ids, res)
            res.repaired_caches = n
            for k in repair_ids:
                self.catalog.set_cache_bytes(k, store.size(k) or 0)

        group: list[_Pending] = []
        for p in pending:
            group.append(p)
            if sum(len(g.chunks) for g in group) >= self.group:
                self._commit_group(group, res)
                group = []
        if group:
            self._commit_group(group, res)

    def _precompute(self, chunks: dict[str, list[int]], res: IngestResult) -> None:
        """Compute the caches of {key: token ids} not stored yet (the keys and ids this ingest made: nothing
        is tokenized twice), reporting progress per forward batch."""
        store = self.engine.store
        todo = {k: ids for k, ids in chunks.items() if k not in store}
        computed, tokens = self.engine.precompute_ids(todo, on_batch=self.progress.advance)
        res.computed_chunks += computed
        res.tokens += tokens
        res.cache_bytes += sum(store.size(k) or 0 for k in todo)

    def _commit_group(self, group: list[_Pending], res: IngestResult) -> None:
        self._precompute({k: ids for p in group for k, ids in zip(p.keys, p.ids)}, res)
        unique = list(dict.fromkeys(c.text for p in group for c in p.chunks))  # a repeated text: embed once
        todo = [t for t in unique if t not in self._vectors]  # all of them, unless a remote run embedded them
        vectors = {**self._vectors, **dict(zip(todo, self.embedder.encode(todo)))} if todo else self._vectors
        for p in group:
            new = []
            for c, key in zip(p.chunks, p.keys):
                emb, size = vectors[c.text].tobytes(), self.engine.store.size(key) or 0
                new.append(NewChunk(c.chunk_id, c.ordinal, c.text, c.tokens, c.hash, key, emb, size))
            added, removed = self.catalog.replace_document(
                p.doc.doc_id, p.doc.path, p.doc.file_hash, p.doc.content_hash, new
            )
            res.new_chunks += added
            res.removed_chunks += removed

    # -- 4: prune, free, index -------------------------------------------------------------------

    def _prune(self, paths: Sequence[str | Path], files: list[Path], res: IngestResult) -> None:
        found = {str(f) for f in files}
        roots = _roots(paths)
        gone = set()
        for path in self.catalog.paths():
            if path in found:
                continue
            if _under(path, roots) or not os.path.exists(path):
                gone.add(path)
        doc_ids = [d for path in sorted(gone) for d in self.catalog.documents_under(path)]
        res.pruned_documents = len(doc_ids)
        res.removed_chunks += self.catalog.remove_documents(doc_ids)

    def _gone(self, paths: Sequence[str | Path], files: list[Path]) -> int:
        """Documents under `paths` whose file is no longer on disk: without `prune` they stay in the store and
        keep being retrieved, which a person who deleted the file does not expect, so the caller warns."""
        found = {str(f) for f in files}
        roots = _roots(paths)
        return sum(
            len(self.catalog.documents_by_path(path))
            for path in self.catalog.paths()
            if path not in found and _under(path, roots) and not os.path.exists(path)
        )

    def _free_caches(self) -> None:
        free_caches(self.catalog, self.engine.store)


def _roots(paths: Sequence[str | Path]) -> list[str]:
    return [str(Path(p).expanduser().resolve()) for p in paths]


def _under(path: str, roots: list[str]) -> bool:
    """Whether `path` is one of `roots` or lies in a folder among them."""
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def check_keys(catalog: Catalog, engine: Engine) -> None:
    """StoreError unless `engine` computes the cache keys this store was built with. The model fingerprint
    and settings are checked when a store is opened, but a key also depends on the instruction prompt and the
    key format, which a new turborag version may change: one chunk's key, recomputed, tells."""
    sample = catalog.sample_chunk()
    if sample is not None and engine.key(engine.layout.chunk_ids(sample[0]), sample[2]) != sample[1]:
        raise StoreError(
            f"store {catalog.root} was built by another version of turborag (its cache keys, which depend on "
            "the prompt, differ from this one's): ingest the documents again into a new --store"
        )


def free_caches(catalog: Catalog, kv) -> int:
    """Delete the caches that no chunk refers to any more; returns bytes freed.

    A shared store that cannot be reached (Redis down) leaves them in place, logged: the catalog no longer
    names them, so `turborag cache gc` deletes them later. The documents' removal, already committed, then
    still succeeds, instead of failing after the fact (a server would answer 503 for a delete that happened,
    and the client's retry would get 404)."""
    freed = 0
    keys = catalog.drop_unreferenced_entries()
    for i, key in enumerate(keys):
        try:
            freed += kv.delete(key)
        except StoreUnavailable as e:
            log.warning(
                "%s; %d unused chunk caches left in the store (`turborag cache gc` deletes them)",
                e,
                len(keys) - i,
            )
            break
    return freed


@dataclass
class IngestPlan:
    """What an ingest of some paths would put in a store, found without computing or writing anything."""

    documents: int = 0
    chunks: int = 0
    tokens: int = 0  # of the distinct chunks, as the prompt holds them (what their caches cover)
    cache_bytes: int = 0  # the distinct chunks' cache tensors in the store's format (headers not counted)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> dict:
        return {k: getattr(self, k) for k in ("documents", "chunks", "tokens", "cache_bytes")}


def plan(
    paths: Sequence[str | Path],
    chunker: Chunker,
    chunk_ids: Callable[[str], list[int]],
    bytes_of: Callable[[int], int],
) -> IngestPlan:
    """`ingest --dry-run`: read, parse and chunk `paths` as ingest would, and count what their caches hold.
    `chunk_ids(text)` gives a chunk's tokens as the prompt holds it, `bytes_of(tokens)` its cache's bytes; a
    chunk text met twice is one cache."""
    report = loaders.LoadReport()
    out = IngestPlan()
    seen: set[tuple[int, ...]] = set()
    for doc in loaders.load(paths, report):
        out.documents += 1
        for chunk in chunker.chunk(doc.doc_id, doc.text):
            out.chunks += 1
            ids = tuple(chunk_ids(chunk.text))
            if ids not in seen:
                seen.add(ids)
                out.tokens += len(ids)
                out.cache_bytes += bytes_of(len(ids))
    out.skipped = report.skipped
    return out


def remove(catalog: Catalog, kv, paths: Sequence[str | Path]) -> tuple[int, int]:
    """`turborag remove PATH...`: drop the documents from these files or folders (whether or not they still
    exist on disk) and their caches. Returns (documents, chunks) removed."""
    with catalog.write_lock():
        doc_ids = []
        for p in paths:
            doc_ids.extend(catalog.documents_under(str(Path(p).expanduser().resolve())))
        chunks = catalog.remove_documents(doc_ids)
        free_caches(catalog, kv)
        return len(doc_ids), chunks


def delete_collection(catalog: Catalog, kv, name: str) -> list[str] | None:
    """Drop collection `name`: its documents and chunks, its index snapshot, and the caches that no chunk of
    any other collection still uses. Returns the source paths its documents had (None: no such collection)."""
    with catalog.write_lock():
        paths = catalog.delete_collection(name)
        if paths is None:
            return None
        free_caches(catalog, kv)
    (catalog.root / index_file(name)).unlink(missing_ok=True)
    return paths


# ---------------------------------------------------------------------------------------------------------
# the index snapshot


def index_file(collection: str) -> str:
    """The snapshot file of a collection's index: `index.safetensors` for `default` (as before collections),
    `index.<name>.safetensors` for another (collection names are safe in file names)."""
    return INDEX_FILE if collection == DEFAULT_COLLECTION else f"index.{collection}.safetensors"


def refresh_index(catalog: Catalog) -> VectorIndex:
    """The current index of the catalog's collection: the snapshot if its generation matches, else rebuilt
    from the catalog's vectors (and saved, when the store is writable)."""
    path = catalog.root / index_file(catalog.collection)
    gen = catalog.generation
    index = VectorIndex.load(path, gen)
    if index is not None:
        return index
    rowids, blobs = catalog.embeddings()
    vectors = np.frombuffer(b"".join(blobs), np.float32).reshape(len(blobs), DIM)  # (N, 384)
    index = VectorIndex(np.array(rowids, np.int64), vectors)
    if catalog.read_only:  # a replica: the ingesting process keeps the snapshot
        return index
    try:
        index.save(path, gen)
    except OSError as e:
        log.warning("could not save the index snapshot %s (%s); using it from memory", path, e)
    return index
