"""API keys and what each may do: the collections it may read and those it may write.

A server is shared, so one key for everything is not enough: `turborag keys add NAME --read a,b --write a`
makes a key, prints it once, and appends only its sha256 to a keys file (JSON lines, one key a line):

    {"name": "team-a", "sha256": "<hex of sha256(key)>", "read": ["a", "b"], "write": ["a"]}

`"*"` stands for every collection. `turborag serve --keys FILE` loads the file; `--api-key KEY` is one more
key that may read and write everything. Keys are compared by their hashes (`hmac.compare_digest`), never
logged and never stored in plain text. Writing a collection does not imply reading it (an ingestion key may
upload without seeing answers); creating or deleting a collection needs write access to it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ALL = "*"


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A fresh random key (256 bits), recognisable by its prefix."""
    return "trk-" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    """Who a request is: a key's name and its scopes."""

    name: str
    read: frozenset[str] = field(default_factory=frozenset)
    write: frozenset[str] = field(default_factory=frozenset)

    def can_read(self, collection: str) -> bool:
        return ALL in self.read or collection in self.read

    def can_write(self, collection: str) -> bool:
        return ALL in self.write or collection in self.write

    def sees(self, collection: str) -> bool:
        """Whether the collection shows in this key's list of collections."""
        return self.can_read(collection) or self.can_write(collection)


EVERYTHING = Principal("admin", frozenset({ALL}), frozenset({ALL}))


@dataclass
class KeyRecord:
    name: str
    sha256: str
    read: list[str]
    write: list[str]

    def line(self) -> str:
        return json.dumps({"name": self.name, "sha256": self.sha256, "read": self.read, "write": self.write})

    def principal(self) -> Principal:
        return Principal(self.name, frozenset(self.read), frozenset(self.write))


class KeysError(Exception):
    """A keys file that cannot be used; the message names the file's line and what is wrong."""


def _names(value, what: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
        raise KeysError(f'{where}: {what!r} must be a list of collection names (or "*")')
    return value


def read_keys(path: Path) -> list[KeyRecord]:
    """The keys of a keys file (an absent file holds none)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path.name} line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise KeysError(f"{where}: not a JSON object") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise KeysError(f'{where}: needs a "name"')
        digest = obj.get("sha256")
        if (
            not isinstance(digest, str)
            or len(digest) != 64
            or not all(c in "0123456789abcdef" for c in digest)
        ):
            raise KeysError(f'{where}: "sha256" must be the key\'s sha256 in lowercase hex')
        read = _names(obj.get("read", []), "read", where)
        write = _names(obj.get("write", []), "write", where)
        out.append(KeyRecord(obj["name"], digest, read, write))
    return out


def write_keys(path: Path, records: Iterable[KeyRecord]) -> None:
    """Rewrite the keys file atomically, readable by its owner only."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(r.line() + "\n" for r in records))
    tmp.chmod(0o600)
    tmp.replace(path)


class Access:
    """The keys a server accepts. With no key at all the API is open (a local, single-user server)."""

    def __init__(self, records: Iterable[tuple[str, Principal]] = (), api_key: str | None = None):
        self._keys: list[tuple[str, Principal]] = list(records)  # (sha256 hex, principal)
        if api_key:
            self._keys.append((key_hash(api_key), EVERYTHING))

    @classmethod
    def from_file(cls, path: Path | None, api_key: str | None = None) -> Access:
        records = read_keys(path) if path is not None else []
        return cls(((r.sha256, r.principal()) for r in records), api_key)

    def with_key(self, api_key: str | None) -> Access:
        """These keys plus `api_key` (allowed everything), or these keys alone when it is None."""
        return Access([*self._keys], api_key)

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def authenticate(self, authorization: str) -> Principal | None:
        """The principal of an `Authorization: Bearer KEY` header, or None for a missing or unknown key.
        Every stored hash is compared, in constant time each, so timing says nothing about which matched."""
        if not self._keys:
            return EVERYTHING
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key:
            return None
        digest = key_hash(key.strip())
        found = None
        for stored, principal in self._keys:
            if hmac.compare_digest(stored, digest) and found is None:
                found = principal
        return found


def check_secret(authorization: str, secret: str) -> bool:
    """Whether `Authorization: Bearer <secret>` was sent (compared by hash, in constant time)."""
    scheme, _, key = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(key_hash(key.strip()), key_hash(secret))
