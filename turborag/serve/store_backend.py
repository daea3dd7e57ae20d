"""The server's view of a store: retrieval and document management, all run on the model worker thread.

SQLite connections belong to the thread that opened them, and ingest needs the model anyway, so the catalog,
embedder and index are opened lazily by the first job on the worker thread and only ever used there.

Uploaded documents are written to `<store>/uploads/<id>/<safe name>`, where `<id>` is chosen by the server,
then ingested like any file (chunked, embedded, caches precomputed). Every document in the store (uploaded
or ingested from the command line) has an API id: the upload id, or a hash of its catalog id.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from pathlib import Path

from turborag.core.engine import Engine


def api_id(doc_id: str) -> str:
    return hashlib.sha256(doc_id.encode()).hexdigest()[:16]


class StoreBackend:
    """Retriever + documents over one store directory (already bound to the engine's model)."""

    def __init__(self, root: str | Path, engine: Engine):
        self.root = Path(root)
        self.engine = engine
        self.uploads = self.root / "uploads"
        self._catalog = None
        self._retriever = None

    def _open(self):
        if self._catalog is None:
            from turborag.rag.embed import Embedder
            from turborag.rag.retrieve import Retriever
            from turborag.store.catalog import Catalog

            self._catalog = Catalog(self.root)
            self._retriever = Retriever(self._catalog, Embedder())
        return self._catalog, self._retriever

    # -- retrieval ---------------------------------------------------------------------------------

    def search(self, question: str, k: int):
        _, retriever = self._open()
        return retriever.search(question, k)

    def _refresh(self) -> None:
        from turborag.rag.ingest import refresh_index

        catalog, retriever = self._open()
        retriever.index = refresh_index(catalog)

    # -- documents ---------------------------------------------------------------------------------

    def add(self, name: str, data: bytes) -> dict:
        """Write the upload under a fresh server-chosen folder and ingest it."""
        from turborag.rag.chunker import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, Chunker
        from turborag.rag.ingest import Ingestor

        catalog, retriever = self._open()
        doc = uuid.uuid4().hex[:16]
        folder = self.uploads / doc
        folder.mkdir(parents=True)
        path = folder / name
        path.write_bytes(data)
        meta = catalog.meta()
        size = int(meta.get("chunk_tokens", DEFAULT_CHUNK_TOKENS))
        chunker = Chunker(
            self.engine.lm.tokenizer, size, int(meta.get("chunk_overlap", min(DEFAULT_OVERLAP, size // 2)))
        )
        try:
            res = Ingestor(self.engine, catalog, retriever.embedder, chunker).run([folder])
        except Exception:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._refresh()
        if res.chunks == 0:
            self.delete(doc)
            raise ValueError(f"{name}: no text could be extracted (empty or unreadable file)")
        return {
            "id": doc,
            "object": "document",
            "name": name,
            "chunks": res.chunks,
            "tokens": res.tokens,
            "new_chunks": res.new_chunks,
        }

    def list(self) -> list[dict]:
        catalog, _ = self._open()
        rows = catalog.db.execute(
            "SELECT d.doc_id, d.path, COUNT(c.id), COALESCE(SUM(c.tokens), 0) FROM documents d "
            "LEFT JOIN chunks c ON c.document = d.id GROUP BY d.id ORDER BY d.ingested"
        )
        out = []
        up = str(self.uploads.resolve()) + "/"
        for doc_id, path, chunks, tokens in rows:
            if path.startswith(up):  # an upload: its id is the folder, its name the file (no server path)
                rel = Path(path[len(up) :])
                out.append(
                    {
                        "id": rel.parts[0],
                        "object": "document",
                        "name": rel.name,
                        "chunks": chunks,
                        "tokens": tokens,
                        "source": "upload",
                    }
                )
            else:
                out.append(
                    {
                        "id": api_id(doc_id),
                        "object": "document",
                        "name": Path(path).name,
                        "chunks": chunks,
                        "tokens": tokens,
                        "source": "ingest",
                    }
                )
        return out

    def delete(self, doc: str) -> bool:
        """Remove a document and its caches; False if no document has that id."""
        from turborag.rag.ingest import free_caches

        catalog, _ = self._open()
        folder = self.uploads / doc
        if folder.is_dir():
            doc_ids = catalog.documents_under(str(folder.resolve()))
        else:
            doc_ids = [d for (d,) in catalog.db.execute("SELECT doc_id FROM documents") if api_id(d) == doc]
        if not doc_ids and not folder.is_dir():
            return False
        with catalog.write_lock():
            catalog.remove_documents(doc_ids)
            free_caches(catalog, self.engine.store)
        shutil.rmtree(folder, ignore_errors=True)
        self._refresh()
        return True
