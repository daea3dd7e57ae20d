"""A new user's first hour with a store (issue 11, items 5, 6, 9): an ingest that finds nothing says so, a
file gone from disk is reported, `cache stats` and `ingest` say what they count, count messages read right."""

from __future__ import annotations

import logging

import pytest
from helpers import cli_json, write_corpus
from typer.testing import CliRunner

from turborag.cli import app

runner = CliRunner()
# The test tokenizer has one token per character, so the prompt form of a chunk, "Passage: <text>\n\n", holds
# exactly len("Passage: ") + len("\n\n") tokens more than the chunk's text.
WRAPPING = len("Passage: ") + len("\n\n")


_json = cli_json


def _store(env):
    return env / "home" / "store"


def _ingest(*args):
    return runner.invoke(app, ["ingest", *map(str, args)])


@pytest.fixture
def corpus_store(env, tiny_model_dir):
    """The made-up corpus in the default store: 10 documents of one chunk each (the default chunk size is
    256 tokens and every document is shorter)."""
    docs = write_corpus(env / "docs")
    out = _json(_ingest(docs, "--model", tiny_model_dir, "--json"))
    assert out["documents"] == out["chunks"] == 10
    return docs, out


def _stats():
    return _json(runner.invoke(app, ["cache", "stats", "--json"]))


# -- item 5: an ingest that finds nothing -----------------------------------------------------------------


def test_plural():
    from turborag.cli.common import plural

    assert plural(0, "document") == "0 documents"
    assert plural(1, "document") == "1 document"
    assert plural(2, "document") == "2 documents"
    assert plural(1, "chunk cache") == "1 chunk cache"
    assert plural(3, "chunk cache") == "3 chunk caches"
    assert plural(1, "entry", "entries") == "1 entry" and plural(2, "entry", "entries") == "2 entries"


def test_empty_folder_into_a_new_store_fails_and_leaves_nothing(env, tiny_model_dir):
    empty = env / "empty"
    empty.mkdir()
    r = _ingest(empty, "--model", tiny_model_dir)
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"error: nothing to ingest in {empty}: no files found; no store was created"
    ]
    assert not _store(env).exists()
    # A later ingest is not bound by settings the empty run would have recorded.
    docs = write_corpus(env / "docs")
    assert (
        _json(_ingest(docs, "--model", tiny_model_dir, "--chunk-tokens", "64", "--json"))["documents"] == 10
    )


def test_unsupported_files_into_a_new_store_fail_and_leave_nothing(env, tiny_model_dir):
    pics = env / "pics"
    pics.mkdir()
    (pics / "photo.png").write_bytes(b"\x89PNG\r\n")
    (pics / "letter.docx").write_bytes(b"PK\x03\x04")
    r = _ingest(pics, "--model", tiny_model_dir, "--json")
    assert r.exit_code == 1 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert lines[:2] == [
        f"skipped {(pics / 'letter.docx').resolve()}: unsupported file type '.docx'",
        f"skipped {(pics / 'photo.png').resolve()}: unsupported file type '.png'",
    ]
    assert lines[2:] == [
        f"error: nothing to ingest in {pics}: no supported, readable document (2 files skipped); "
        "no store was created"
    ]
    assert not _store(env).exists()


def test_only_empty_text_files_into_a_new_store_leave_nothing(env, tiny_model_dir):
    """A supported file with no text is only found out by reading it, after the store was opened: the store
    this run created is removed again, and a `--store` folder that existed before is kept (empty)."""
    blank = env / "blank"
    blank.mkdir()
    (blank / "empty.txt").write_text("")
    r = _ingest(blank, "--model", tiny_model_dir)
    assert r.exit_code == 1 and "nothing to ingest" in r.stderr and "(1 file skipped)" in r.stderr
    assert not _store(env).exists()
    mine = env / "mine"
    mine.mkdir()
    r = _ingest(blank, "--model", tiny_model_dir, "--store", mine)
    assert r.exit_code == 1 and mine.is_dir() and list(mine.iterdir()) == []
    nested = env / "a" / "b" / "store"
    r = _ingest(blank, "--model", tiny_model_dir, "--store", nested)
    assert r.exit_code == 1 and not (env / "a").exists()


def test_a_failed_first_ingest_leaves_no_store(env):
    """A new store opened for an ingest that stops before anything is ingested (here: no such model) is taken
    back, so it does not hold settings that the next ingest would have to match."""
    docs = write_corpus(env / "docs")
    r = _ingest(docs, "--model", env / "no-such-model")
    assert r.exit_code == 2 and "error:" in r.stderr and not _store(env).exists()


def test_nothing_to_ingest_into_an_existing_store_warns(corpus_store, env):
    empty = env / "empty"
    empty.mkdir()
    pics = env / "pics"
    pics.mkdir()
    (pics / "photo.png").write_bytes(b"\x89PNG\r\n")
    before = _stats()
    r = _ingest(empty)
    assert r.exit_code == 0 and f"warning: nothing to ingest in {empty}: no files found" in r.stderr
    r = _ingest(pics, "--json")
    out = _json(r)  # the JSON shape is unchanged; the warning is on stderr
    assert set(out) == {
        "documents",
        "chunks",
        "new_chunks",
        "removed_chunks",
        "tokens",
        "seconds",
        "cache_bytes",
        "found_caches",
    }
    assert "warning: nothing to ingest in" in r.stderr and "(1 file skipped)" in r.stderr
    assert _stats() == before  # the store is intact


# -- item 5: a file gone from disk ---------------------------------------------------------------------


def _retrieved(question):
    out = _json(runner.invoke(app, ["ask", question, "--top-k", "10", "--max-new-tokens", "1", "--json"]))
    return {c.split("#")[0].rsplit("/", 1)[-1] for c in out["chunks"]}


def test_file_gone_from_disk_is_reported_until_pruned(corpus_store, env):
    docs, _ = corpus_store
    (docs / "bakery.txt").unlink()
    r = _ingest(docs)
    assert r.exit_code == 0
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: 1 document under {docs} is gone from disk but still searchable in the store; "
        "ingest with --prune to drop it"
    ]
    assert "bakery.txt" in _retrieved("Which pastry is sold only on Fridays?")  # still searchable
    (docs / "school.md").unlink()
    r = _ingest(docs, "--json")
    assert _json(r)["documents"] == 8 and "2 documents under" in r.stderr and "drop them" in r.stderr

    r = _ingest(docs, "--prune")
    assert r.exit_code == 0 and "warning" not in r.stderr and "2 documents pruned" in r.stdout
    found = _retrieved("Which pastry is sold only on Fridays?")
    assert "bakery.txt" not in found and "school.md" not in found and len(found) == 8
    r = _ingest(docs)
    assert r.exit_code == 0 and "warning" not in r.stderr


# -- item 6: numbers that agree ------------------------------------------------------------------------


def test_removed_cache_is_not_counted_as_present(corpus_store, env):
    docs, _ = corpus_store
    kv = sorted((_store(env) / "kv").glob("*/*.safetensors"))
    kv[0].write_bytes(kv[0].read_bytes()[:-10])  # truncated: verify removes it
    assert runner.invoke(app, ["cache", "verify"]).exit_code == 1 and not kv[0].exists()
    stats = _stats()
    assert stats["cache_entries"] == 10  # the catalog still names it: the next ingest recomputes it
    assert stats["cache_files"] == 9 and stats["missing_caches"] == 1
    assert stats["cache_bytes"] == stats["disk_bytes"]  # bytes of the caches present, as on disk
    r = runner.invoke(app, ["cache", "stats"])
    assert r.exit_code == 0 and "cache files present" in r.stdout and "cache entries" in r.stdout
    assert "1 chunk cache is missing" in r.stderr
    out = _json(_ingest(docs, "--json"))
    assert out["new_chunks"] == 0 and out["tokens"] > 0  # repaired
    stats = _stats()
    assert stats["cache_files"] == stats["cache_entries"] == 10 and stats["missing_caches"] == 0


def test_ingest_tokens_and_stats_tokens_say_what_they_count(env, tiny_model_dir):
    docs = write_corpus(env / "docs")
    r = _ingest(docs, "--model", tiny_model_dir)
    assert r.exit_code == 0 and 'tokens as the prompt holds them ("Passage: " wrapping included)' in r.stdout
    computed = int(r.stdout.split("chunk caches: ")[1].split(" tokens")[0].replace(",", ""))
    stats = _stats()
    # ingest counts each computed cache's tokens as the prompt holds them; stats counts the chunk texts alone
    assert computed == stats["tokens"] + WRAPPING * stats["chunks"]
    table = runner.invoke(app, ["cache", "stats"]).stdout
    assert "chunk text tokens" in table and "without" in table


# -- item 9: count messages ----------------------------------------------------------------------------


def test_count_messages_read_right(corpus_store, env, caplog):
    docs, _ = corpus_store
    r = runner.invoke(app, ["cache", "verify"])
    assert r.exit_code == 0 and r.stderr.startswith(
        "10 chunk caches ok (format 2: 10, format 1: 0), 0 missing, "
    )
    assert "removed" not in r.stderr and "0 damaged" in r.stderr

    kv = sorted((_store(env) / "kv").glob("*/*.safetensors"))
    kv[0].write_bytes(kv[0].read_bytes()[:-10])
    r = runner.invoke(app, ["cache", "verify"])
    assert "9 chunk caches ok" in r.stderr and "1 damaged and removed" in r.stderr
    assert "1 chunk cache needs recomputing" in r.stderr
    with caplog.at_level(logging.WARNING):
        r = _ingest(docs)
    assert "1 chunk cache was missing; recomputing it" in caplog.text
    assert "10 documents (10 unchanged), 10 chunks: 0 new, 0 removed" in r.stdout
    assert "(1 missing chunk cache recomputed)" in r.stdout and "Computed 1 chunk cache: " in r.stdout

    kv = sorted((_store(env) / "kv").glob("*/*.safetensors"))
    kv[0].unlink()
    kv[1].unlink()
    r = runner.invoke(app, ["cache", "verify"])
    assert "2 missing" in r.stderr and "2 chunk caches need recomputing" in r.stderr
    with caplog.at_level(logging.WARNING):
        r = _ingest(docs)
    assert "2 chunk caches were missing; recomputing them" in caplog.text
    assert "(2 missing chunk caches recomputed)" in r.stdout

    r = runner.invoke(app, ["remove", str(docs / "bakery.txt")])
    assert r.stdout.startswith("removed 1 document (1 chunk) from ")
    r = runner.invoke(app, ["remove", str(docs / "school.md"), str(docs / "market.md")])
    assert r.stdout.startswith("removed 2 documents (2 chunks) from ")
    r = runner.invoke(app, ["cache", "gc"])
    assert r.stderr.startswith("removed 0 unused files, ")
    (_store(env) / "kv" / "00").mkdir(exist_ok=True)
    (_store(env) / "kv" / "00" / ("0" * 64 + ".safetensors")).write_bytes(b"x")
    assert runner.invoke(app, ["cache", "gc"]).stderr.startswith("removed 1 unused file, ")

    one = env / "one"
    one.mkdir()
    (one / "note.txt").write_text("The lighthouse keeper feeds the gulls on Sundays.\n")
    r = _ingest(one)
    assert r.stdout.startswith(
        "1 document (0 unchanged), 1 chunk: 1 new, 0 removed. Computed 1 chunk cache: "
    )
