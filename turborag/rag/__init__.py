"""Layer 3, documents to answers: load files, chunk, embed and index, ingest into a store, retrieve."""
