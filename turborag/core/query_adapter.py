"""A LoRA adapter that runs only at query time: on the question and the answer, never on the context.

Turbo reads chunk caches that each passage's own forward computed, blind to the other passages; a model
reading them answers worse than the same model reading everything at once (`full`). A query-side adapter
teaches the question and answer tokens to read such caches, while the caches themselves stay the frozen
base model's. So:

- one store serves the base model and every query-side adapter of it: the cache key is the base's
  fingerprint, and no chunk is recomputed when an adapter changes;
- `full` mode is the base model by construction (the adapter is off for its whole prompt);
- the prefix, every chunk cache, the training-free recomputes and plain prompts run with the adapter off.

The adapter's LoRA layers (peft) are injected into the model unmerged and switched off; a forward that
feeds query tokens switches them on for its own duration (`active`). A batched forward that mixes rows
with and without the adapter (a server decoding turbo and full requests together) uses peft's mixed-batch
forward, which adds each LoRA product to its own rows only.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

SIDE = "query"  # `side` in an adapter's turborag_finetune.json
ADAPTER = "default"  # peft's name for the one adapter loaded
BASE = "__base__"  # peft's name for "no adapter" in a mixed batch

# model -> (its LoRA layers, each LoRA parameter with the requires_grad it had when registered)
_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def attach(model: torch.nn.Module, adapter: Path) -> None:
    """Inject the LoRA layers of the peft adapter folder `adapter` into `model`, in place and switched off."""
    from peft import PeftModel

    PeftModel.from_pretrained(model, str(adapter))  # injects into `model` itself; the wrapper is not needed
    register(model)


def register(model: torch.nn.Module) -> None:
    """Treat the LoRA layers already in `model` (a training run's) as its query-side adapter: off."""
    from peft.tuners.lora import LoraLayer

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    if not layers:
        raise ValueError("no LoRA layers in the model: not a query-side adapter")
    params = [(p, p.requires_grad) for n, p in model.named_parameters() if "lora_" in n]
    _LAYERS[_unwrapped(model)] = (layers, params)
    _switch((layers, params), False)


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model itself under a peft wrapper (a training run's), whose layers hold the LoRA weights."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def attached(model: torch.nn.Module) -> bool:
    """Whether `model` carries a query-side adapter."""
    return _unwrapped(model) in _LAYERS


def _switch(held: tuple[list, list], on: bool) -> None:
    """peft's switch, which also sets requires_grad on the LoRA weights: that is put back as registered, so
    that a training run's backward, after the forward's context is left, still reaches them."""
    layers, params = held
    for layer in layers:
        layer.enable_adapters(on)
    for p, grad in params:
        p.requires_grad_(grad)


@contextlib.contextmanager
def active(model: torch.nn.Module, rows: bool | Sequence[bool]) -> Iterator[None]:
    """The adapter on for the forwards inside, for the batch rows that are True (all rows when `rows` is a
    bool); off again afterwards. A model without a query-side adapter is left alone."""
    held = _LAYERS.get(_unwrapped(model))
    flags = [rows] if isinstance(rows, bool) else list(rows)
    if held is None or not any(flags):
        yield
        return
    hooks = []
    if not all(flags):
        names = [ADAPTER if f else BASE for f in flags]

        def per_row(_module, args, kwargs):
            return args, {**kwargs, "adapter_names": names}

        hooks = [layer.register_forward_pre_hook(per_row, with_kwargs=True) for layer in held[0]]
    _switch(held, True)
    try:
        yield
    finally:
        _switch(held, False)
        for hook in hooks:
            hook.remove()
