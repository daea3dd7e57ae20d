"""`turborag bench isolation` on a tiny model: per-collection keys hold one copy of the passages per
collection and make every same-text guess compute its cache, as a new text does; shared keys hold one copy
and answer every same-text guess from it. (Timings are the benchmark's to report, not asserted here.)"""

from __future__ import annotations

import torch
from conftest import char_tokenizer, make

from turborag.bench.isolation import bench_isolation
from turborag.core.engine import Engine
from turborag.core.model import LoadedModel, fingerprint
from turborag.store.kv_store import KVStore


def test_per_collection_keys_double_the_bytes_and_close_the_channel(tmp_path):
    model, tok = make("llama"), char_tokenizer()
    lm = LoadedModel(model, tok, "tiny", fingerprint(model, tok), torch.device("cpu"), torch.float32)
    engine = Engine(lm, KVStore(tmp_path / "own", cache_format="float32"))
    rows = {r.cache_keys: r for r in bench_isolation(engine, guesses=3, chunk_tokens=32, log=lambda _m: None)}
    shared, isolated = rows["shared"], rows["per-collection"]
    assert isolated.cache_bytes == 2 * shared.cache_bytes > 0
    assert (shared.same_text_computed, isolated.same_text_computed) == (0, 3)
    assert shared.same_faster + shared.new_faster <= 3 and 0 <= isolated.p <= 1
    assert not any((tmp_path / "own").glob("**/*.safetensors"))  # the engine's own store is not touched
