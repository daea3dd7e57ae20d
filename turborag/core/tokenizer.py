"""Load a model folder's tokenizer, fast once it has been shown to be the same tokenizer.

transformers 5 builds some tokenizers (Gemma's among them) in Python, from the vocabulary and merges it parses
out of tokenizer.json, and parses that file again for its added tokens: 3 s of every cold start for Gemma 3's
33 MB file, more than its weights take. The Rust `tokenizers` library reads the same file in about 1 s, and
`PreTrainedTokenizerFast(tokenizer_file=...)` wraps it without a copy.

The two are not the same object, so the fast one is used only after it has been checked against the class the
folder names (`AutoTokenizer`), once per tokenizer: the ids of probe texts with and without special tokens,
their decoding, the special tokens, the vocabulary and the chat template. The verdict is remembered in
$TURBORAG_HOME/models/tokenizers.json under the digests of the tokenizer files and the library versions, so
a changed file or an upgraded library is checked again. A tokenizer that fails the check, or a folder
without tokenizer.json, always loads through `AutoTokenizer`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from turborag.core.files import file_digest, read_index, write_index

VERDICTS = "tokenizers.json"
_CONFIG_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# tokenizer_config.json entries that describe how transformers found the class, not the tokenizer itself
_NOT_INIT_KWARGS = {
    "tokenizer_class",
    "backend",
    "auto_map",
    "added_tokens_decoder",
    "is_local",
    "local_files_only",
}
# attributes set by the class (not by tokenizer.json) that the fast tokenizer must copy to behave the same
_CLASS_ATTRS = ("padding_side", "truncation_side")
_PROBES = (
    "Hello world",
    "Answer the question using the passages below.\n\nPassage: The pass statement does nothing.\n\n",
    "  leading spaces,\ttabs\n\n\nand  double  spaces ",
    "ünïcödé, 日本語のテキスト, emoji 🙂, math ∑ x² ≤ 3",
    "def f(x: int = 3) -> int:\n    return x ** 2  # comment",
    "1234567890 3.14159 -42 1e-9 0x1F",
    "",
    " ",
    "Question: What is the default value of `width`?\nAnswer:",
)


def _key(folder: Path) -> str:
    import tokenizers
    import transformers

    h = hashlib.sha256(f"{transformers.__version__} {tokenizers.__version__}".encode())
    for name in _CONFIG_FILES:
        path = folder / name
        h.update(name.encode() + (file_digest(path) if path.exists() else "-").encode())
    return h.hexdigest()


def _fast(folder: Path, class_attrs: dict):
    """The Rust tokenizer of tokenizer.json, with the special tokens and options of tokenizer_config.json."""
    from transformers import PreTrainedTokenizerFast

    kwargs = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins, as in transformers
        path = folder / name
        if path.exists():
            kwargs.update(json.loads(path.read_text(encoding="utf-8")))
    kwargs = {k: v for k, v in kwargs.items() if k not in _NOT_INIT_KWARGS}
    kwargs = PreTrainedTokenizerFast.convert_added_tokens(kwargs, save=False)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **kwargs)
    tok.name_or_path = str(folder)
    for name, value in class_attrs.items():
        setattr(tok, name, value)
    return tok


def _behaviour(tok) -> dict:
    """What the engine relies on a tokenizer for, as comparable values."""
    special = " ".join(tok.all_special_tokens)
    texts = [*_PROBES, special, f"{special} text {special}"]
    out = {
        "len": len(tok),
        "special_ids": list(tok.all_special_ids),
        "special_tokens": list(tok.all_special_tokens),
        "ids": [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id],
        "chat_template": tok.chat_template,
        "model_max_length": tok.model_max_length,
        "vocab": tok.get_vocab(),
        **{name: getattr(tok, name) for name in _CLASS_ATTRS},
    }
    for i, text in enumerate(texts):
        with_special = tok(text)["input_ids"]
        plain = tok(text, add_special_tokens=False)["input_ids"]
        out[f"probe{i}"] = [
            with_special,
            plain,
            tok.decode(with_special),
            tok.decode(with_special, skip_special_tokens=True),
            tok.convert_ids_to_tokens(plain),
        ]
    return out


def load_tokenizer(folder: Path):
    """The folder's tokenizer: the checked fast path when it is known to be identical, else AutoTokenizer."""
    from transformers import AutoTokenizer

    if not (folder / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(folder))
    key = _key(folder)
    verdict = read_index(VERDICTS).get(key)
    if isinstance(verdict, dict) and verdict.get("fast"):
        return _fast(folder, verdict.get("attrs", {}))
    if isinstance(verdict, dict):  # checked before and found different
        return AutoTokenizer.from_pretrained(str(folder))
    slow = AutoTokenizer.from_pretrained(str(folder))
    attrs = {name: getattr(slow, name) for name in _CLASS_ATTRS}
    try:
        same = _behaviour(_fast(folder, attrs)) == _behaviour(slow)
    except Exception:  # a config the plain fast class cannot take: the slow path it is
        same = False
    index = read_index(VERDICTS)
    index[key] = {"fast": same, "attrs": attrs, "folder": str(folder)}
    write_index(VERDICTS, index)
    return slow
