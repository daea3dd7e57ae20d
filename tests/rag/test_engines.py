"""`turborag.open`: the engine of a store, built and checked as the commands build it, failing with library
exceptions (never exiting the process)."""

from __future__ import annotations

import pytest
from conftest import char_tokenizer, make

import turborag
from turborag.rag.engines import ModelError, StoreError, open_engine, scratch_engine


def test_open_binds_then_reopens_with_the_store_model(tmp_path, tiny_model_dir):
    store = tmp_path / "store"
    first = turborag.open(store=store, model=tiny_model_dir, ingest=True, dtype="float32")
    again = turborag.open(store=store)  # the model the store recorded
    assert again.lm.fingerprint == first.lm.fingerprint
    assert again.store.cache_format == first.store.cache_format


def test_a_store_refuses_another_model(tmp_path, tiny_model_dir):
    store = tmp_path / "store"
    open_engine(store, tiny_model_dir, ingest=True, dtype="float32")
    other = tmp_path / "other"
    make("llama").save_pretrained(other)
    char_tokenizer().save_pretrained(other)
    with pytest.raises(StoreError, match="useless to this model"):
        open_engine(store, str(other))


def test_library_errors_not_exits(tmp_path):
    with pytest.raises(StoreError, match="no such store|not a store|does not exist|missing"):
        open_engine(tmp_path / "missing")
    empty = tmp_path / "empty"
    turborag.Catalog(empty, create=True).close()
    with pytest.raises(StoreError, match="is empty"):
        open_engine(empty)
    with pytest.raises(ModelError):
        scratch_engine(str(tmp_path / "no-model"), store=tmp_path / "kv")
