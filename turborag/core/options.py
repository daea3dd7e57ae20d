"""How an engine answers, as one value given when it is built (`Engine(lm, store, options)`).

The command line, the server and the benches build an `EngineOptions` from their flags and hand it over;
nothing sets a built engine's attributes afterwards. An engine that should answer otherwise for a while (a
calibration trying candidates, a benchmark timing with and without the abstention score) is a variant of
it, `engine.with_options(...)`, sharing the model, the caches and the prefix cache.

`None` means "as the model records it, else the default": the fine-tune records its abstention threshold
and name check, `turborag calibrate` the training-free settings (core/model.py reads both).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from turborag.core.defaults import DECODE_WEIGHTS


@dataclass(frozen=True)
class TrainingFree:
    """The settings of the training-free modes an engine answers with. The defaults are recompute.py's
    (epic's first k tokens of a chunk, blend's share of the most-deviating tokens) and the APE paper's
    (arXiv 2502.05431) attention temperature and scale."""

    recompute_k: int = 16
    recompute_ratio: float = 0.15
    ape_temperature: float = 0.9
    ape_scale: float = 0.9


TRAINING_FREE_DEFAULTS = asdict(TrainingFree())  # {name: default}: the names calibration may set


@dataclass(frozen=True)
class EngineOptions:
    template: str = "auto"  # prompt template: auto (chat if the model has one), plain, chat
    # Abstain when the model gives the abstention reply at least this probability; 0: only when greedy
    # decoding picks it; None: the fine-tune's recorded threshold (none for other models).
    abstain_threshold: float | None = None
    # Decline a question that names something no passage mentions; None: as the fine-tune records it.
    name_check: bool | None = None
    # The training-free modes (turbo-epic, turbo-blend, turbo-ape); None: as calibrated, else the default.
    recompute_k: int | None = None
    recompute_ratio: float | None = None
    ape_temperature: float | None = None
    ape_scale: float | None = None
    # Tokens a prefill forward takes at most; None: the whole prompt in one forward (fastest alone).
    prefill_step: int | None = None
    batch_size: int = 4  # chunks a precompute forward takes
    ram_cache_bytes: int = 0  # the RAM tier's budget for decoded chunk caches (store/tiered.py)
    prefix_block: int = 64  # the plain-prompt prefix cache's block, in tokens (prefix_cache.py)
    prefix_cache_tokens: int = 32768  # and its capacity
    # The weights decode steps read: "float" (the model's), or "int8" / "int4" copies on a CPU
    # (decode_weights.py); prefills always read the model's own, so the caches are the same either way.
    decode_weights: str = "float"
    # Key chunk caches per collection (a store's `--isolate-collections`): no cache is shared, so a request
    # cannot tell by its speed which passages another collection holds.
    isolate_collections: bool = False

    def __post_init__(self):
        if self.template not in ("auto", "plain", "chat"):
            raise ValueError(f"unknown template {self.template!r}: use auto, plain or chat")
        if self.abstain_threshold is not None and not 0 <= self.abstain_threshold <= 1:
            raise ValueError("abstain_threshold must be in [0, 1]")
        if self.recompute_k is not None and self.recompute_k < 0:
            raise ValueError("recompute_k must be >= 0")
        if self.recompute_ratio is not None and not 0 <= self.recompute_ratio <= 1:
            raise ValueError("recompute_ratio must be in [0, 1]")
        for name in ("ape_temperature", "ape_scale"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0")
        if self.prefill_step is not None and self.prefill_step < 1:
            raise ValueError("prefill_step must be at least 1")
        if self.batch_size < 1 or self.prefix_block < 1 or self.prefix_cache_tokens < 0:
            raise ValueError("batch_size and prefix_block must be >= 1, prefix_cache_tokens >= 0")
        if self.decode_weights not in DECODE_WEIGHTS:
            raise ValueError(f"unknown decode weights {self.decode_weights!r}: use float, int8 or int4")
        if self.ram_cache_bytes < 0:
            raise ValueError(f"the RAM tier budget must be >= 0 bytes, got {self.ram_cache_bytes}")
