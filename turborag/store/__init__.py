"""Layer 1, the store: chunk K/V caches (`chunk_kv`, `kv_store`) and the SQLite catalog."""
