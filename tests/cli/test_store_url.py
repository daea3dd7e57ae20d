"""`--store-url`: a store's caches somewhere else than its folder, recorded in the store; sizes as options."""

from __future__ import annotations

import pytest
from helpers import cli_json, write_corpus
from typer.testing import CliRunner

from turborag.cli import app
from turborag.cli.common import parse_bytes

runner = CliRunner()
ASK = ["ask", "Who rings the bell at the harbour?", "--mode", "turbo", "--json"]


def test_caches_live_where_the_url_says_and_the_store_remembers(env, tiny_model_dir):
    docs = write_corpus(env / "docs")
    elsewhere = env / "shared-kv"
    url = elsewhere.resolve().as_uri()  # file:///...
    out = cli_json(
        runner.invoke(
            app,
            [
                "ingest",
                str(docs),
                "--model",
                tiny_model_dir,
                "--chunk-tokens",
                "64",
                "--store-url",
                url,
                "--json",
            ],
        )
    )
    assert out["new_chunks"] > 0
    assert len(list((elsewhere / "kv").glob("*/*.safetensors"))) == out["chunks"]
    assert not (env / "home" / "store" / "kv").exists()  # nothing in the store's own folder
    ask = cli_json(
        runner.invoke(app, ["ask", "Who rings the bell at the harbour?", "--mode", "turbo", "--json"])
    )
    assert ask["cached_tokens"] > 0  # read from the URL's folder, which the store recorded
    stats = cli_json(runner.invoke(app, ["cache", "stats", "--json"]))
    assert stats["cache_files"] == stats["cache_entries"] > 0 and stats["missing_caches"] == 0
    again = runner.invoke(app, ["ingest", str(docs), "--store-url", (env / "other").as_uri()])
    assert (
        again.exit_code == 2 and again.stderr.startswith("error: ") and "keeps its caches in" in again.stderr
    )


def test_bad_store_urls_are_one_line(env, tiny_model_dir):
    docs = write_corpus(env / "docs")
    for url, words in [("ftp://host/x", "unknown store URL"), ("file://otherhost/x", "local path")]:
        r = runner.invoke(
            app,
            [
                "ingest",
                str(docs),
                "--model",
                tiny_model_dir,
                "--store",
                str(env / url[:3]),
                "--store-url",
                url,
            ],
        )
        assert r.exit_code == 2 and r.stderr.startswith("error: ") and words in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "text,value",
    [("0", 0), ("4096", 4096), ("64k", 65536), ("512M", 512 << 20), ("2G", 2 << 30), ("1.5GiB", 3 << 29)],
)
def test_sizes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1G", "2X"])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_serve_refuses_a_bad_ram_size(env):
    r = runner.invoke(app, ["serve", "--ram-cache-bytes", "lots"])
    assert r.exit_code == 2 and r.stderr.startswith("error: --ram-cache-bytes: not a size")


def test_a_capped_store_stays_under_its_cap_and_still_answers_right(env, tiny_model_dir):
    docs = write_corpus(env / "docs")
    ingest = ["ingest", str(docs), "--model", tiny_model_dir, "--chunk-tokens", "64", "--json"]
    full = cli_json(runner.invoke(app, [*ingest, "--store", str(env / "full")]))
    cap = full["cache_bytes"] // 3
    capped = cli_json(
        runner.invoke(app, [*ingest, "--store", str(env / "capped"), "--max-disk-bytes", str(cap)])
    )
    assert capped["chunks"] == full["chunks"]
    stats = cli_json(runner.invoke(app, ["cache", "stats", "--store", str(env / "capped"), "--json"]))
    assert stats["disk_bytes"] <= cap and stats["disk_tier"]["evictions"] > 0
    assert stats["missing_caches"] > 0 and stats["disk_tier"]["max_bytes"] == cap
    question = [*ASK, "--max-new-tokens", "6"]
    want = cli_json(runner.invoke(app, [*question, "--store", str(env / "full")]))
    for _ in range(2):  # evicted chunks are recomputed, stored again, and the cap still holds
        got = cli_json(runner.invoke(app, [*question, "--store", str(env / "capped")]))
        assert got["answer"] == want["answer"] and got["chunks"] == want["chunks"]
        after = cli_json(runner.invoke(app, ["cache", "stats", "--store", str(env / "capped"), "--json"]))
        assert after["disk_bytes"] <= cap


def test_a_compressed_store_takes_about_half_the_bytes_and_answers(env, tiny_model_dir):
    docs = write_corpus(env / "docs")
    ingest = ["ingest", str(docs), "--model", tiny_model_dir, "--chunk-tokens", "64", "--json"]
    plain = cli_json(runner.invoke(app, [*ingest, "--store", str(env / "plain")]))
    small = cli_json(runner.invoke(app, [*ingest, "--store", str(env / "int8"), "--cache-format", "int8"]))
    assert small["chunks"] == plain["chunks"] and small["cache_bytes"] < 0.6 * plain["cache_bytes"]
    stats = cli_json(runner.invoke(app, ["cache", "stats", "--store", str(env / "int8"), "--json"]))
    assert stats["cache_format"] == "int8" and stats["missing_caches"] == 0
    question = [*ASK, "--max-new-tokens", "4"]
    out = cli_json(runner.invoke(app, [*question, "--store", str(env / "int8")]))
    assert out["cached_tokens"] > 0 and out["chunks"][0].split("#")[0].endswith("harbour.md")
    again = runner.invoke(app, ["ingest", str(docs), "--store", str(env / "int8"), "--cache-format", "fp8"])
    assert again.exit_code == 2 and "keeps its caches as int8, not fp8" in again.stderr
    bad = runner.invoke(app, [*ingest, "--store", str(env / "x"), "--cache-format", "int4"])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: unknown --cache-format 'int4'")
