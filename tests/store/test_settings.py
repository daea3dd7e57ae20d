"""StoreSettings: the catalog's meta strings turned into typed values and back, checked on the way in."""

from __future__ import annotations

import pytest

from turborag.store.catalog import Catalog, StoreError
from turborag.store.settings import SettingsError, StoreSettings


def test_round_trip_through_the_meta_table_keeps_types_and_the_stored_key():
    s = StoreSettings(
        model="m", model_fingerprint="f" * 12, cache_format="int8", chunk_tokens=128, chunk_overlap=0
    )
    meta = s.as_meta()
    assert meta["store_dtype"] == "int8" and "cache_format" not in meta  # the key every store has
    assert meta["chunk_tokens"] == "128" and "template" not in meta  # unset settings are not written
    back = StoreSettings.from_meta({**meta, "schema": "2", "generation": "7"})  # other keys are not settings
    assert back == s and back.chunk_overlap == 0 and back.bound


@pytest.mark.parametrize(
    "meta, message",
    [
        ({"chunk_tokens": "many"}, "not a number"),
        ({"store_dtype": "float64"}, "unknown cache format"),
        ({"max_disk_bytes": "-1"}, "must be >= 0"),
    ],
)
def test_a_damaged_setting_is_an_error_that_names_it(meta, message):
    with pytest.raises(SettingsError, match=message):
        StoreSettings.from_meta(meta)


def test_differences_ignore_a_setting_only_one_side_has():
    recorded = StoreSettings(dtype="float32", chunk_tokens=64)
    assert recorded.differences(StoreSettings(dtype="float32", template="plain")) == []
    assert recorded.differences(StoreSettings(chunk_tokens=128)) == [("chunk_tokens", "64", "128")]


def test_a_catalog_binds_once_and_refuses_other_settings(tmp_path):
    catalog = Catalog(tmp_path / "s", create=True)
    assert not catalog.settings().bound
    bound = StoreSettings(model="tiny", model_fingerprint="a" * 32, dtype="float32", chunk_tokens=64)
    catalog.bind(bound)
    catalog.bind(bound)  # the same again: fine
    catalog.record(max_disk_bytes=1000)
    assert catalog.settings() == StoreSettings(**{**vars(bound), "max_disk_bytes": 1000})
    with pytest.raises(StoreError, match="uses dtype float32, not bfloat16"):
        catalog.check(StoreSettings(dtype="bfloat16", model_fingerprint="a" * 32))
    with pytest.raises(StoreError, match="was built with model tiny"):
        catalog.check(StoreSettings(model="other", model_fingerprint="b" * 32))
    with pytest.raises(SettingsError):
        catalog.record(cache_format="float64")


def test_the_torch_free_format_names_are_the_codecs():
    from turborag.store import codec
    from turborag.store.settings import CACHE_FORMATS

    assert tuple(CACHE_FORMATS) == tuple(codec.FORMATS)
