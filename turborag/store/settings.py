"""What a store is bound to: the settings every cache in it was computed under, typed.

The catalog keeps them as strings in its `meta` table (catalog.py); this is the one place that turns them
into values and back, so the rest of the code reads `catalog.settings().chunk_tokens` (an int or None),
never a string from the table. A store records each setting when it is first bound and refuses a different
one later (`Catalog.bind`), because a cache computed under other settings would answer wrongly.

The cache format (float16, bfloat16, float32, int8, fp8: store/codec.py) has one name here, `cache_format`.
The table's key for it stays `store_dtype`, as every store written so far has it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# The cache formats (store/codec.py's FORMATS, named here without torch: opening a catalog, as `--help` and a
# mistyped --store do, never imports it; tests/store/test_settings.py checks that the two agree).
CACHE_FORMATS = ("float16", "bfloat16", "float32", "int8", "fp8")
SHARED, PER_COLLECTION = "shared", "per-collection"
CACHE_KEYS = (SHARED, PER_COLLECTION)
# The table's key for a field, where the two differ.
_META_KEY = {"cache_format": "store_dtype"}
_INTS = ("chunk_tokens", "chunk_overlap", "max_disk_bytes")


class SettingsError(ValueError):
    """A recorded setting that cannot be read (a hand-edited or damaged catalog)."""


@dataclass(frozen=True)
class StoreSettings:
    model: str | None = None  # the `--model` spec the store was built with (a name or an absolute path)
    model_fingerprint: str | None = None  # hash of the weights and config: every cache was computed by it
    template: str | None = None  # the prompt template: plain or chat
    dtype: str | None = None  # the compute dtype the caches were computed in: float32, bfloat16, float16
    cache_format: str | None = None  # how the caches are stored (codec.FORMATS)
    embedder: str | None = None  # the retrieval embedder of the chunks' vectors
    chunk_tokens: int | None = None
    chunk_overlap: int | None = None
    max_disk_bytes: int | None = None  # a file store's cap (0 or None: none)
    kv_url: str | None = None  # where the caches live when not in the store's own folder (redis://...)
    # "shared": one cache per chunk text, whichever collections use it; "per-collection": keyed apart per
    # collection (`ingest --isolate-collections`), so no request can tell by its speed what another holds
    cache_keys: str | None = None

    def __post_init__(self):
        if self.cache_keys is not None and self.cache_keys not in CACHE_KEYS:
            raise SettingsError(f"unknown cache keys {self.cache_keys!r}: use one of {CACHE_KEYS}")
        if self.cache_format is not None and self.cache_format not in CACHE_FORMATS:
            raise SettingsError(f"unknown cache format {self.cache_format!r}: use one of {CACHE_FORMATS}")
        for name in _INTS:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise SettingsError(f"{name} must be >= 0, got {value}")

    @property
    def bound(self) -> bool:
        """Whether a model has been bound to the store (its first ingest)."""
        return self.model_fingerprint is not None

    @classmethod
    def from_meta(cls, meta: dict[str, str]) -> StoreSettings:
        """The settings in a catalog's meta table (other keys, such as the schema, are not settings)."""
        values = {}
        for f in fields(cls):
            raw = meta.get(_META_KEY.get(f.name, f.name))
            if raw is None:
                continue
            if f.name in _INTS:
                try:
                    values[f.name] = int(raw)
                except ValueError:
                    raise SettingsError(f"the catalog records {f.name} {raw!r}, not a number") from None
            else:
                values[f.name] = raw
        return cls(**values)

    def as_meta(self) -> dict[str, str]:
        """The settings that are set, as the meta table keeps them."""
        return {
            _META_KEY.get(f.name, f.name): str(getattr(self, f.name))
            for f in fields(self)
            if getattr(self, f.name) is not None
        }

    def differences(self, other: StoreSettings) -> list[tuple[str, str, str]]:
        """(name, ours, theirs) for every setting both have and that differs; one only one side has is no
        difference (a store made before a setting existed never recorded it)."""
        out = []
        for f in fields(self):
            ours, theirs = getattr(self, f.name), getattr(other, f.name)
            if ours is not None and theirs is not None and ours != theirs:
                out.append((f.name, str(ours), str(theirs)))
        return out
