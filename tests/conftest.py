"""Tiny random models (Llama, Qwen2, Gemma 3) and a character tokenizer, built offline from configs."""

from __future__ import annotations

import string

import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from turborag.core.model import LoadedModel, fingerprint

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list(string.printable)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character: BPE with no merges, decoded by fusing the pieces."""
    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


VOCAB = len(SPECIALS) + len(CHARS)
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    attn_implementation="sdpa",
)


def tiny_llama(rope_scaling: dict | None = None) -> torch.nn.Module:
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if rope_scaling:
        rope.update(rope_scaling)
    return LlamaForCausalLM(LlamaConfig(**COMMON, rope_parameters=rope))


def tiny_qwen2() -> torch.nn.Module:
    return Qwen2ForCausalLM(
        Qwen2Config(**COMMON, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    )


def tiny_gemma3(sliding_window: int = 16) -> torch.nn.Module:
    cfg = Gemma3TextConfig(
        **COMMON,
        head_dim=16,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    )
    return Gemma3ForCausalLM(cfg)


def tiny_mistral() -> torch.nn.Module:
    return MistralForCausalLM(
        MistralConfig(
            **COMMON, sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6}
        )
    )


# One tiny random model per family of turborag/core/arch.py (tests/core/test_arch.py holds them to it), and
# the RoPE scalings whose re-positioning must stay exact.
TINY = {"llama": tiny_llama, "qwen2": tiny_qwen2, "gemma3": tiny_gemma3, "mistral": tiny_mistral}
VARIANTS = {
    "llama-linear": lambda: tiny_llama({"rope_type": "linear", "factor": 4.0}),
    "llama3": lambda: tiny_llama(
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    ),
}


def make(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return {**TINY, **VARIANTS}[kind]().eval()


ARCHS = [*TINY, *VARIANTS]


@pytest.fixture(params=ARCHS)
def tiny_lm(request) -> LoadedModel:
    model = make(request.param)
    tok = char_tokenizer()
    return LoadedModel(
        model, tok, f"tiny-{request.param}", fingerprint(model, tok), torch.device("cpu"), torch.float32
    )


@pytest.fixture
def gemma_lm() -> LoadedModel:
    """A tiny Gemma 3 (the default model's architecture) with its sliding window crossed by every prompt."""
    model = make("gemma3")
    tok = char_tokenizer()
    return LoadedModel(model, tok, "tiny-gemma3", fingerprint(model, tok), torch.device("cpu"), torch.float32)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny Gemma 3 saved as an HF folder, for the CLI (`--model DIR`)."""
    out = tmp_path_factory.mktemp("tiny-gemma3")
    make("gemma3").save_pretrained(out)
    char_tokenizer().save_pretrained(out)
    return str(out)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A temp folder that is also $TURBORAG_HOME/.. (stores, converted models and caches go under it)."""
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    return tmp_path
