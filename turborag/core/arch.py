"""Model families: what cache reuse needs to know about an architecture, in one table.

The engine runs any Hugging Face decoder that keeps HF's conventions: a model-level rotary module
(`model.model.rotary_emb`), `config.layer_types` and `config.sliding_window` for sliding layers, K/V heads
and head size in the config. What differs between families is in `FAMILIES`:

- `rope_per_layer_type`: the rotary module keeps one inverse-frequency table per layer type, named
  `{layer_type}_inv_freq` (Gemma 3: base 1e4 on sliding layers, 1e6 on global ones); otherwise one
  `inv_freq` serves every layer.
- `end_of_turn`: the chat markers that end an answer, besides the tokenizer's and the generation config's
  EOS ids. A marker the tokenizer does not know is skipped.
- `lora_targets`: the linear layers a fine-tune adapts.

A model type missing from the table runs as `GENERIC`: HF's conventions and every marker known here.
`check_supported` refuses it, as any model, when its rotary module cannot be re-positioned.

Adding a family is an entry here and its tiny random model in tests/conftest.py (`TINY`), which the
invariant tests (positions, sliding windows, turbo against full) run on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turborag.core.errors import ModelError

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.model_type values of the family
    end_of_turn: tuple[str, ...]
    lora_targets: tuple[str, ...] = PROJECTIONS
    rope_per_layer_type: bool = False


FAMILIES: tuple[Family, ...] = (
    # Llama 3 ends a turn with <|eot_id|>; chat models built on Llama's architecture (SmolLM2) use ChatML's.
    Family("llama", ("llama",), end_of_turn=("<|eot_id|>", "<|im_end|>", "<|endoftext|>")),
    Family("qwen2", ("qwen2",), end_of_turn=("<|im_end|>", "<|endoftext|>")),
    Family("gemma3", ("gemma3_text",), end_of_turn=("<end_of_turn>",), rope_per_layer_type=True),
    # Mistral's instruct models end a turn with the tokenizer's EOS (</s>) alone.
    Family("mistral", ("mistral",), end_of_turn=()),
)
GENERIC = Family("generic", (), end_of_turn=tuple(dict.fromkeys(m for f in FAMILIES for m in f.end_of_turn)))
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def family(model: torch.nn.Module) -> Family:
    """The model's family, by `config.model_type` (GENERIC for a type not in the table)."""
    return _BY_TYPE.get(getattr(model.config, "model_type", None), GENERIC)


def end_of_turn_ids(tokenizer, model: torch.nn.Module) -> set[int]:
    """Every id that ends a turn: tokenizer EOS, generation-config EOS, and the family's chat markers."""
    ids: set[int] = set()
    for src in (
        tokenizer.eos_token_id,
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
    ):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(x) for x in src)
    for marker in family(model).end_of_turn:
        tid = tokenizer.convert_tokens_to_ids(marker)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
            ids.add(tid)
    return ids


# ---------------------------------------------------------------------------------------------------------
# per-layer facts: attention type, sliding window, RoPE frequencies, K/V shape


def rotary_module(model: torch.nn.Module) -> torch.nn.Module:
    """The model-level rotary embedding."""
    inner = getattr(model, "model", model)
    rot = getattr(inner, "rotary_emb", None)
    if rot is None:
        raise ModelError(
            f"{type(model).__name__}: no model-level rotary embedding; cache re-positioning unsupported"
        )
    return rot


def layer_types(model: torch.nn.Module) -> list[str]:
    """Attention type of each layer ("full_attention" / "sliding_attention")."""
    cfg = model.config
    types = getattr(cfg, "layer_types", None)
    return list(types) if types else ["full_attention"] * cfg.num_hidden_layers


def layer_windows(model: torch.nn.Module) -> list[int | None]:
    """Sliding window of each layer (None = global): `config.sliding_window` for "sliding_attention" layers.

    A model that slides every layer without naming layer types (some Mistral configs) gets None everywhere:
    serving then keeps whole contexts for it, which is exact, only not as lean.
    """
    window = getattr(model.config, "sliding_window", None)
    return [window if lt == "sliding_attention" and window else None for lt in layer_types(model)]


def layer_inv_freq(model: torch.nn.Module) -> list[torch.Tensor]:
    """RoPE inverse frequencies used by each layer, (head_dim // 2,) each, fp64.

    Read from the model's own rotary module, which built them from the config (base, scaling type and
    factor). Position-independent scalings (default, linear, llama3, yarn, ...) are a fixed rotation per
    position, so re-positioning by d is exact; dynamic NTK changes frequencies with the sequence length and
    is refused (check_supported).
    """
    rot = rotary_module(model)
    fam = family(model)
    out = []
    for lt in layer_types(model):
        # a family not in the table uses per-type tables where its rotary module has them
        per_type = fam.rope_per_layer_type or (fam is GENERIC and hasattr(rot, f"{lt}_inv_freq"))
        name = f"{lt}_inv_freq" if per_type else "inv_freq"
        inv = getattr(rot, name, None)
        if inv is None:
            raise ModelError(
                f"{type(model).__name__}: its rotary module has no {name} (layer type {lt}); "
                "a family that keeps its RoPE tables differently needs an entry in turborag/core/arch.py"
            )
        out.append(inv.detach().to(torch.float64).cpu())
    return out


def check_supported(model: torch.nn.Module) -> None:
    """Refuse models whose RoPE cannot be re-positioned by a fixed rotation."""
    rot = rotary_module(model)
    rope_types = getattr(rot, "rope_type", "default")
    kinds = set(rope_types.values()) if isinstance(rope_types, dict) else {rope_types}
    bad = kinds & {"dynamic", "longrope"}
    if bad:
        raise ModelError(
            f"RoPE type {sorted(bad)} depends on sequence length; cached keys cannot be re-positioned"
        )
    layer_inv_freq(model)


def kv_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of the model's K/V cache."""
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, kv_heads, head_dim


def bytes_per_token(model: torch.nn.Module, dtype: torch.dtype = torch.float16) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x bytes per element of `dtype`."""
    layers, kv_heads, head_dim = kv_shape(model)
    return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
