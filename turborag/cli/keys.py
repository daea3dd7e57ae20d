"""`turborag keys add | list | remove`: the scoped API keys of `turborag serve --keys FILE`.

`add` prints the new key once and stores only its sha256 (the file is JSON lines, one key a line, readable
by its owner only; serve/access.py describes the format). `--read` and `--write` take comma-separated
collection names, `*` for all of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from turborag.cli.common import JsonOpt, fail
from turborag.core.defaults import turborag_home

app = typer.Typer(help="Scoped API keys for `turborag serve --keys FILE`.", no_args_is_help=True)

KeysFileOpt = typer.Option(None, "--keys", help="keys file (default: $TURBORAG_HOME/keys.jsonl)")


def _file(keys: Path | None) -> Path:
    return (keys or turborag_home() / "keys.jsonl").expanduser()


def _collections(value: str, option: str) -> list[str]:
    from turborag.store.catalog import StoreError, check_collection_name

    names = [x.strip() for x in value.split(",") if x.strip()]
    for n in names:
        if n != "*":
            try:
                check_collection_name(n)
            except StoreError as e:
                fail(f"{option}: {e}")
    return names


def _records(path: Path):
    from turborag.serve.access import KeysError, read_keys

    try:
        return read_keys(path)
    except KeysError as e:
        fail(str(e))


@app.command("add")
def keys_add(
    name: str = typer.Argument(..., help="a name for the key (who holds it)"),
    read: str = typer.Option("", "--read", help="collections it may read (comma-separated; * for all)"),
    write: str = typer.Option("", "--write", help="collections it may write (comma-separated; * for all)"),
    keys: Path = KeysFileOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Make a key: printed once on stdout, only its hash kept in the keys file."""
    from turborag.serve.access import KeyRecord, key_hash, new_key, write_keys

    path = _file(keys)
    records = _records(path)
    if any(r.name == name for r in records):
        fail(f"a key named {name!r} is already in {path}: remove it first or choose another name")
    r, w = _collections(read, "--read"), _collections(write, "--write")
    if not r and not w:
        fail("a key needs --read or --write (collection names, or * for all)")
    key = new_key()
    write_keys(path, [*records, KeyRecord(name, key_hash(key), r, w)])
    if as_json:
        typer.echo(json.dumps({"name": name, "key": key, "read": r, "write": w, "file": str(path)}))
        return
    typer.echo(key)
    typer.echo(f"key {name!r} added to {path} (only its hash is stored: keep the key now)", err=True)


@app.command("list")
def keys_list(keys: Path = KeysFileOpt, as_json: bool = JsonOpt) -> None:
    """The keys' names and scopes (never the keys: only their hashes are stored)."""
    rows = [{"name": r.name, "read": r.read, "write": r.write} for r in _records(_file(keys))]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    for row in rows:
        typer.echo(
            f"{row['name']}: read {','.join(row['read']) or '-'}; write {','.join(row['write']) or '-'}"
        )


@app.command("remove")
def keys_remove(name: str = typer.Argument(...), keys: Path = KeysFileOpt) -> None:
    """Revoke a key (a running server reads its keys file when it starts)."""
    from turborag.serve.access import write_keys

    path = _file(keys)
    records = _records(path)
    kept = [r for r in records if r.name != name]
    if len(kept) == len(records):
        fail(f"no key named {name!r} in {path}")
    write_keys(path, kept)
    typer.echo(f"key {name!r} removed from {path}", err=True)
