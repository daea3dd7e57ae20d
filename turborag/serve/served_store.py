"""The server's view of a store: retrieval and document management, all run on the model worker thread.

SQLite connections belong to the thread that opened them, and ingest needs the model anyway, so the catalog,
embedder and index are opened lazily by the first job on the worker thread and only ever used there.

Uploaded documents are written to `<store>/uploads/<id>/<safe name>`, where `<id>` is chosen by the server,
then ingested like any file (chunked, embedded, caches precomputed). Every document in the store (uploaded
or ingested from the command line) has an API id: the upload id, or a hash of its catalog id; each record of
an uploaded JSONL file is a document of its own, `<upload id>-<hash of its record>` (the upload id deletes
them all). Responses name documents and chunks by these ids, ordinals and file names only, never by server
paths.

A store holds named collections (`default` unless a request names another); retrieval, listing and deletion
see one collection, and each collection has its own retriever, rebuilt when the catalog's generation moves
(an upload, a delete, or a `turborag ingest` from the command line while the server runs).
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from turborag.core.engine import Engine
from turborag.rag.ingest import Progress
from turborag.serve import upload_journal
from turborag.serve.errors import APIError


class UploadCancelled(Exception):
    """The client of an upload left; its ingest stops (ServedStore.add)."""


class _Cancellable(Progress):
    """Ingest progress that stops the ingest once `cancelled` is set (checked at every batch of caches)."""

    def __init__(self, cancelled: threading.Event, turn: Callable[[int], None] | None = None):
        self.cancelled = cancelled
        self.turn = turn  # hands the model back to the worker after each batch (serve/turns.py)

    def check(self) -> None:
        if self.cancelled.is_set():
            raise UploadCancelled

    def advance(self, chunks: int, tokens: int) -> None:
        self.check()
        if self.turn is not None:
            self.turn(tokens)
            self.check()  # the client may have left while other requests had the model


def api_id(doc_id: str) -> str:
    return hashlib.sha256(doc_id.encode()).hexdigest()[:16]


def record_id(upload: str, doc_id: str) -> str:
    """The API id of one record (catalog id `path#record`) of an uploaded JSONL file."""
    return f"{upload}-{api_id(doc_id)[:12]}"


class ServedStore:
    """Retriever + documents over one store directory (already bound to the engine's model)."""

    def __init__(self, root: str | Path, engine: Engine, read_only: bool = False):
        self.root = Path(root)
        self.engine = engine
        self.read_only = read_only  # a replica (`serve --read-only`): the catalog opened with SQLite mode=ro
        self.uploads = self.root / "uploads"
        self._catalog = None
        self._embedder = None
        self._retrievers: dict[str, tuple[int, object]] = {}  # collection -> (generation, Retriever)

    def recover_uploads(self) -> upload_journal.Recovered:
        """Roll back the uploads a crashed server left half-ingested (upload_journal.py); run at start, on
        the calling thread, with a catalog connection of its own."""
        from turborag.store.catalog import Catalog

        catalog = Catalog(self.root)
        try:
            with catalog.write_lock():
                return upload_journal.recover(catalog, self.engine.store)
        finally:
            catalog.close()

    def _open(self):
        if self._catalog is None:
            from turborag.rag.embed import Embedder
            from turborag.store.catalog import Catalog

            self._catalog = Catalog(self.root, read_only=self.read_only)
            self._embedder = Embedder()
        return self._catalog

    def _view(self, collection: str):
        """The catalog seen through `collection`; a 404 if the store has no such collection."""
        from turborag.store.catalog import StoreError

        catalog = self._open()
        try:
            return catalog.use(collection)
        except StoreError:
            raise APIError(
                404, f"no collection {collection!r}", code="collection_not_found", param="collection"
            ) from None

    # -- retrieval ---------------------------------------------------------------------------------

    def retriever(self, collection: str = "default"):
        """The collection's retriever, its index rebuilt if the catalog changed since it was loaded."""
        from turborag.rag.retrieve import Retriever

        view = self._view(collection)
        gen = view.generation
        cached = self._retrievers.get(collection)
        if cached is None or cached[0] != gen:
            cached = self._retrievers[collection] = (gen, Retriever(view, self._embedder))
        return cached[1]

    def search(self, question: str, k: int, collection: str = "default"):
        return self.retriever(collection).search(question, k)

    def chunk_ref(self, hit) -> dict:
        """How a response names a retrieved chunk: its document's API id, its ordinal and the document's
        display name (the file name, with the record id for a JSONL record), never a server path."""
        return {
            "id": f"{self.document_id(hit.doc_id, hit.path)}#{hit.ordinal}",
            "document": self.document_id(hit.doc_id, hit.path),
            "ordinal": hit.ordinal,
            "name": Path(hit.doc_id).name,
        }

    def document_id(self, doc_id: str, path: str) -> str:
        """A document's API id: the upload's folder for an uploaded file, `<folder>-<hash>` for a record of
        an uploaded JSONL file, else a hash of its catalog id."""
        up = str(self.uploads.resolve()) + "/"
        if not path.startswith(up):
            return api_id(doc_id)
        upload = Path(path[len(up) :]).parts[0]
        return upload if doc_id == path else record_id(upload, doc_id)

    # -- collections -------------------------------------------------------------------------------

    def collections(self) -> list[dict]:
        catalog = self._open()
        out = []
        for name in catalog.collections():
            stats = catalog.use(name).stats()
            out.append(
                {
                    "id": name,
                    "object": "collection",
                    "documents": stats["documents"],
                    "chunks": stats["chunks"],
                    "tokens": stats["tokens"],
                }
            )
        return out

    def create_collection(self, name: str) -> bool:
        """Create an empty collection; False if it exists."""
        return self._open().create_collection(name)

    def delete_collection(self, name: str) -> bool:
        """Drop a collection, its uploads, and the caches no other collection uses; False if there is none."""
        from turborag.rag.ingest import delete_collection

        catalog = self._open()
        paths = delete_collection(catalog, self.engine.store, name)
        if paths is None:
            return False
        self._retrievers.pop(name, None)
        up = str(self.uploads.resolve()) + "/"
        for folder in {Path(p[len(up) :]).parts[0] for p in paths if p.startswith(up)}:
            shutil.rmtree(self.uploads / folder, ignore_errors=True)
        return True

    # -- documents ---------------------------------------------------------------------------------

    def add(
        self,
        name: str,
        data: bytes,
        collection: str = "default",
        cancelled: threading.Event | None = None,
        turn: Callable[[int], None] | None = None,
    ) -> dict:
        """Write the upload under a fresh server-chosen folder and ingest it into `collection`. The counts
        returned are the catalog's (the same as the list shows), whether or not its caches were computed
        now or were already there (the same text in another collection).

        `cancelled` (its client left) stops the ingest at its next batch of caches and takes back what it
        added: the upload's documents, their caches that nothing else uses, its folder (499). `turn(tokens)`
        is called after each batch of caches (serve/turns.py: other requests run in between)."""
        view = self._view(collection)
        doc = uuid.uuid4().hex[:16]
        folder = self.uploads / doc
        upload_journal.begin(folder, collection)  # a crash from here on is rolled back at the next start
        try:
            return self._add(
                view, doc, folder, name, data, collection, _Cancellable(cancelled or threading.Event(), turn)
            )
        finally:
            upload_journal.end(folder)

    def _add(self, view, doc: str, folder: Path, name: str, data: bytes, collection: str, watch) -> dict:
        """`add` once its journal marker is written."""
        from turborag.rag.chunker import Chunker, chunking
        from turborag.rag.ingest import Ingestor, StoreWriteError

        folder.mkdir(parents=True)
        path = folder / name
        path.write_bytes(data)
        recorded = view.settings()
        size, overlap = chunking(recorded.chunk_tokens, recorded.chunk_overlap)
        chunker = Chunker(self.engine.lm.tokenizer, size, overlap)
        ingestor = Ingestor(self.engine, view, self._embedder, chunker, progress=watch)
        try:
            watch.check()
            res = ingestor.run([folder])
        except UploadCancelled:
            self.delete(doc, collection)  # the groups committed before the client left
            ingestor.take_back()  # and the caches of the group under way
            shutil.rmtree(folder, ignore_errors=True)
            raise APIError(499, "client closed the request", code="client_disconnected") from None
        except StoreWriteError:
            shutil.rmtree(folder, ignore_errors=True)
            raise APIError(
                507,
                "the store could not be written (disk full or not writable)",
                "server_error",
                "store_write_failed",
            ) from None
        except Exception:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if res.chunks == 0:
            self.delete(doc, collection)
            shutil.rmtree(folder, ignore_errors=True)
            why = res.skipped[0][1] if res.skipped else "no text could be extracted (empty file?)"
            raise ValueError(f"{name}: {why}")
        doc_ids = view.documents_under(str(folder.resolve()))
        rows = view.cache_keys_of(doc_ids)
        added = {
            "id": doc,
            "object": "document",
            "name": name,
            "collection": collection,
            "chunks": len(rows),
            "tokens": sum(tokens for _, _, tokens in rows),
            "new_chunks": res.new_chunks,
            # counted for this collection alone: that another one holds the same text is not its business
            "computed_chunks": res.new_to_collection,
        }
        records = [d for d in doc_ids if "#" in Path(d).name]  # a JSONL file: a document per `path#record`
        if records:
            added["documents"] = sorted(record_id(doc, d) for d in records)
        return added

    def list(self, collection: str = "default") -> list[dict]:
        view = self._view(collection)
        rows = view.document_rows()
        up = str(self.uploads.resolve()) + "/"
        return [
            {
                "id": self.document_id(doc_id, path),
                "object": "document",
                "name": Path(doc_id).name,  # the file name, with `#record` for a JSONL record
                "collection": collection,
                "chunks": chunks,
                "tokens": tokens,
                "source": "upload" if path.startswith(up) else "ingest",
            }
            for doc_id, path, chunks, tokens in rows
        ]

    def delete(self, doc: str, collection: str = "default") -> bool:
        """Remove a document of `collection` (an upload whole, or one record of an uploaded JSONL file) and
        the caches nothing else uses; False if the collection has no document with that id (an upload of
        another collection is not touched)."""
        from turborag.rag.ingest import free_caches

        view = self._view(collection)
        upload, _, record = doc.partition("-")
        folder = self.uploads / upload
        if folder.is_dir():
            doc_ids = view.documents_under(str(folder.resolve()))
            if record:
                doc_ids = [d for d in doc_ids if record_id(upload, d) == doc]
        else:
            doc_ids = [d for d in view.doc_ids() if api_id(d) == doc]
        if not doc_ids:
            return False
        with view.write_lock():
            view.remove_documents(doc_ids)
            free_caches(view, self.engine.store)
        if folder.is_dir() and not self._open().any_document_under(str(folder.resolve())):
            shutil.rmtree(folder, ignore_errors=True)
        return True
