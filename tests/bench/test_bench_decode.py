"""`turborag bench decode` on tiny models: every sequence decodes exactly the steps timed, the bytes a step
reads are counted as the model holds them, and llama.cpp's absence or a model with no GGUF is said clearly."""

from __future__ import annotations

import sys

import torch
from conftest import char_tokenizer, make
from helpers import cli_json
from typer.testing import CliRunner

from turborag.bench import decode
from turborag.cli import app
from turborag.core import decode_weights
from turborag.core.engine import Engine
from turborag.core.model import LoadedModel, fingerprint
from turborag.store.kv_store import KVStore

runner = CliRunner()


def _engine(tmp_path, kind: str = "gemma3") -> Engine:
    model, tok = make(kind), char_tokenizer()
    lm = LoadedModel(model, tok, "tiny", fingerprint(model, tok), torch.device("cpu"), torch.float32)
    return Engine(lm, KVStore(tmp_path, cache_format="float32"))


def test_every_sequence_decodes_the_steps_timed(tmp_path):
    engine = _engine(tmp_path)
    chunks = decode.doc_chunks(engine, 64)
    engine.precompute(chunks)
    for n in (1, 3):
        states = decode._sequences(engine, n, chunks, steps=5)
        decode._timed_steps(engine, states, 5)
        assert all(s.finished and len(s.stream.ids) == 6 for s in states)  # the first token + 5 steps


def test_rows_count_each_sequences_tokens(tmp_path):
    engine = _engine(tmp_path)
    rows = decode.bench_decode(engine, (1, 2), steps=3, context_tokens=64)
    assert [(r.weights, r.sequences, r.steps) for r in rows] == [("float", 1, 3), ("float", 2, 3)]
    for r in rows:
        assert r.tokens_per_s == r.sequences * r.steps / r.seconds
        assert r.kv_bytes > 0 and r.weight_bytes == decode.weight_bytes(engine.lm.model)
    assert rows[1].kv_bytes == 2 * rows[0].kv_bytes


def test_int8_copies_are_the_bytes_a_few_sequences_read():
    model = make("gemma3")  # tied output layer
    floats = decode.weight_bytes(model)
    decode_weights.use_decode_weights(model, "int8")
    linears = [m for m in model.modules() if isinstance(m, decode_weights.DecodeLinear)]
    saved = sum(m.weight.numel() * 4 - m.qweight.numel() - m.qscale.numel() * 2 for m in linears)
    assert decode.weight_bytes(model, 1) == floats - saved
    assert decode.weight_bytes(model, decode_weights.FEW_ROWS + 1) == floats  # a large batch reads floats


def test_weight_bytes_count_a_tied_head_once_and_skip_an_untied_embedding():
    tied, untied = make("gemma3"), make("llama")
    assert tied.get_output_embeddings().weight is tied.get_input_embeddings().weight
    assert decode.weight_bytes(tied) == sum(p.numel() * 4 for p in tied.parameters())
    emb = untied.get_input_embeddings().weight
    assert untied.get_output_embeddings().weight is not emb
    assert decode.weight_bytes(untied) == sum(p.numel() * 4 for p in untied.parameters()) - emb.numel() * 4


def test_kv_bytes_stop_at_a_sliding_window():
    model = make("gemma3")  # layers: 3 sliding (window 16), 1 global; 2 K/V heads of 16
    assert decode.kv_bytes(model, 100, torch.float32) == 2 * (3 * 16 + 100) * 2 * 16 * 4
    assert decode.kv_bytes(model, 10, torch.bfloat16) == 2 * (4 * 10) * 2 * 16 * 2


def test_memory_bandwidth_is_measured():
    bw = decode.memory_bandwidth(buffer_bytes=1 << 22, repeats=2)
    assert bw.bytes_per_s > 0 and bw.buffer_bytes == 1 << 22


def test_cli_json(tiny_model_dir, env):
    args = ["bench", "decode", "--model", tiny_model_dir, "--sequences", "1,2", "--steps", "2"]
    out = cli_json(runner.invoke(app, [*args, "--context-tokens", "64", "--json"]))
    assert [(r["weights"], r["sequences"]) for r in out["rows"]] == [
        ("float", 1),
        ("float", 2),
        ("int8", 1),
        ("int8", 2),
    ]
    assert out["llama_cpp"] is None
    for r in out["rows"]:
        assert r["bound_tokens_per_s"] == r["sequences"] * out["bandwidth_bytes_per_s"] / (
            r["weight_bytes"] + r["kv_bytes"]
        )


def test_bad_weights_are_refused(tiny_model_dir, env):
    args = ["bench", "decode", "--model", tiny_model_dir, "--weights", "int3"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "float, int8 and int4" in result.output


def test_llama_cpp_auto_needs_a_model_converted_from_a_gguf(tiny_model_dir, env):
    args = ["bench", "decode", "--model", tiny_model_dir, "--sequences", "1", "--steps", "2"]
    result = runner.invoke(app, [*args, "--context-tokens", "64", "--llama-cpp", "auto"])
    assert result.exit_code == 2 and "was not converted from a GGUF" in result.output


def test_llama_cpp_missing_names_the_extra(tiny_model_dir, env, monkeypatch):
    gguf = env / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as if not installed
    args = ["bench", "decode", "--model", tiny_model_dir, "--sequences", "1", "--steps", "2"]
    result = runner.invoke(app, [*args, "--context-tokens", "64", "--llama-cpp", str(gguf)])
    assert result.exit_code == 2 and "turborag[llamacpp]" in result.output
