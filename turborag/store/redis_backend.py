"""Chunk caches in Redis or a Redis Cluster, so that many serving replicas share one cache.

- One string value per chunk, the codec's blob as it is, under `turborag:kv:<64 hex>`. Blobs are
  self-describing and hash-checked on read (codec.py), so Redis needs no schema and a damaged value is
  caught, deleted and recomputed by `KVStore` exactly like a damaged file.
- No hash tags: the keys of one request hash to different slots, so a cluster spreads the chunks (memory and
  load) over its shards. `get_many` is still one round trip: one MGET on a single Redis; on a cluster, one
  pipeline of GETs per shard, the shards read in parallel.
- No TTL: blobs are content-addressed, so one never goes stale. Give Redis `maxmemory` and
  `maxmemory-policy allkeys-lru` to make it an LRU cache of chunks; an evicted chunk is a miss, recomputed.
- Faults: short socket timeouts and a single immediate retry on a broken connection (a pooled connection
  that died with a server restart), so an operation that cannot reach Redis raises `StoreUnavailable`
  (errors.py) within seconds, with one line naming the URL and why: never a raw redis exception, never a
  hang.

URL options (query string, all optional): `timeout` and `connect_timeout` in seconds, `prefix` for the keys.
A single Redis passes any other option to redis-py (`redis://h:6379/0?ssl_cert_reqs=none`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from turborag.store.errors import StoreUnavailable

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, RedisCluster
    from redis.exceptions import ClusterError, RedisClusterException
    from redis.retry import Retry

    # What "cannot reach Redis" looks like: ConnectionError (includes refused, reset, auth and busy
    # loading), TimeoutError, ClusterError (cluster or master down) and RedisClusterException (no reachable
    # node, slot not covered). Answers such as WRONGTYPE or OOM are not faults of reachability: they pass.
    _UNREACHABLE: tuple[type[BaseException], ...] = (
        redis.ConnectionError,
        redis.TimeoutError,
        ClusterError,
        RedisClusterException,
    )
except ImportError:  # the optional extra is not installed: open_redis says how to install it
    redis = None

DEFAULT_PREFIX = "turborag:kv:"
CONNECT_TIMEOUT = 2.0  # seconds to open a connection
TIMEOUT = 2.0  # seconds to wait on a reply (per read, so a large reply is not cut short)
__all__ = ["DEFAULT_PREFIX", "RedisBackend", "StoreUnavailable", "open_redis"]


def open_redis(
    url: str,
    *,
    prefix: str | None = None,
    timeout: float | None = None,
    connect_timeout: float | None = None,
) -> RedisBackend:
    """The backend for `redis://[[user]:password@]host:port/db` (`rediss://` for TLS) or
    `redis+cluster://[[user]:password@]host:port[,host:port...]` (the startup nodes of a cluster).
    Keyword arguments override the URL's options. Pings every primary once: raises StoreUnavailable if one
    cannot be reached, ValueError for a malformed URL, ImportError without the `redis` package."""
    if redis is None:
        raise ImportError(
            f"the store {public_url(url)} needs the redis package: pip install 'turborag[redis]'"
        )
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query))
    ours = {name: options.pop(name, None) for name in ("prefix", "timeout", "connect_timeout")}
    prefix = prefix if prefix is not None else ours["prefix"] or DEFAULT_PREFIX
    timeout = timeout if timeout is not None else float(ours["timeout"] or TIMEOUT)
    connect_timeout = (
        connect_timeout if connect_timeout is not None else float(ours["connect_timeout"] or CONNECT_TIMEOUT)
    )
    common = dict(
        socket_timeout=timeout,
        socket_connect_timeout=connect_timeout,
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
    )
    shown = public_url(url)
    cluster = parts.scheme == "redis+cluster"
    with _reachable(shown):
        if cluster:
            if options:
                raise ValueError(
                    f"{shown}: unknown options {sorted(options)} (timeout, connect_timeout, prefix)"
                )
            if parts.path not in ("", "/", "/0"):
                raise ValueError(f"{shown}: a Redis Cluster has only database 0")
            user, password, nodes = _cluster_netloc(parts.netloc)
            client = RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in nodes],
                username=user,
                password=password,
                **common,
            )
            client.ping(target_nodes=RedisCluster.PRIMARIES)
        else:
            client = redis.Redis.from_url(urlunsplit(parts._replace(query=urlencode(options))), **common)
            client.ping()
    return RedisBackend(client, shown, prefix, cluster)


class RedisBackend:
    """Blobs as Redis string values under `prefix + key`. Thread-safe (redis-py pools its connections), and
    usable in a forked child (the pools reconnect there, and the shard-reading threads are made anew)."""

    def __init__(self, client, url: str, prefix: str = DEFAULT_PREFIX, cluster: bool = False):
        self.client = client  # redis.Redis or redis.cluster.RedisCluster
        self.url = url  # for messages: no password
        self.prefix = prefix
        self.cluster = cluster
        self._pool: ThreadPoolExecutor | None = None  # reads the shards of a cluster in parallel
        self._pool_pid = 0  # the process that made it: threads do not survive a fork

    def _raw(self, key: str) -> str:
        return self.prefix + key

    def __contains__(self, key: str) -> bool:
        with _reachable(self.url):
            return bool(self.client.exists(self._raw(key)))

    def get(self, key: str) -> bytearray | None:
        """The blob, or None when missing. A bytearray, because the codec makes writable zero-copy views."""
        with _reachable(self.url):
            value = self.client.get(self._raw(key))
        return None if value is None else bytearray(value)

    def get_many(self, keys: list[str]) -> dict[str, bytearray]:
        """key -> blob for the keys present, in one round trip (see the module docstring)."""
        if not keys:
            return {}
        raw = [self._raw(k) for k in keys]
        with _reachable(self.url):
            values = self._cluster_mget(raw) if self.cluster else self.client.mget(raw)
        return {k: bytearray(v) for k, v in zip(keys, values) if v is not None}

    def _cluster_mget(self, raw: list[str]) -> list[bytes | None]:
        """The values of `raw` keys from a cluster: one pipeline of GETs per shard, the shards in parallel.

        Not redis-py's `mget_nonatomic`, because of a hung shard: its pipeline then retries that shard's
        commands one by one, a timeout each (40 s for a shard holding 17 keys, with a 1 s timeout). Here a
        timeout fails the call at once. Anything else (a refused connection, MOVED after a failover or a
        resharding) goes to `mget_nonatomic`, which follows redirections, refreshes the slot map and fails
        fast on a refusal."""
        by_node: dict[str, list[str]] = {}
        nodes = {}
        for key in raw:
            node = self.client.get_node_from_key(key)
            nodes[node.name] = node
            by_node.setdefault(node.name, []).append(key)

        def fetch(name: str) -> dict[str, bytes | None]:
            pipe = self.client.get_redis_connection(nodes[name]).pipeline(transaction=False)
            for key in by_node[name]:
                pipe.get(key)
            return dict(zip(by_node[name], pipe.execute()))

        try:
            found: dict[str, bytes | None] = {}
            if self._pool_pid != os.getpid():
                self._pool, self._pool_pid = ThreadPoolExecutor(8, "turborag-redis"), os.getpid()
            for part in self._pool.map(fetch, by_node):
                found.update(part)
        except redis.TimeoutError:
            raise
        except (redis.ConnectionError, redis.ResponseError):  # refused, MOVED, ASK, TRYAGAIN, CLUSTERDOWN
            return self.client.mget_nonatomic(raw)
        return [found[key] for key in raw]

    def put(self, key: str, blob: bytes) -> int:
        """SET: idempotent, since the key is the hash of what the blob holds. Returns bytes written."""
        data = blob if isinstance(blob, (bytes, memoryview)) else bytes(blob)  # redis-py refuses bytearray
        with _reachable(self.url):
            self.client.set(self._raw(key), data)
        return len(data)

    def delete(self, key: str) -> int:
        """Bytes freed, 0 if missing; of two concurrent deletes, only the one that deleted counts them."""
        pipe = self.client.pipeline(transaction=False)
        pipe.strlen(self._raw(key))
        pipe.delete(self._raw(key))
        with _reachable(self.url):
            size, deleted = pipe.execute()
        return size if deleted else 0

    def size(self, key: str) -> int | None:
        with _reachable(self.url):
            size = self.client.strlen(self._raw(key))
            if size == 0 and not self.client.exists(self._raw(key)):  # STRLEN says 0 for a missing key too
                return None
        return size

    def keys(self) -> Iterator[str]:
        """Every key under the prefix: SCAN (on every primary of a cluster), so Redis is never blocked."""
        match = _glob_escape(self.prefix) + "*"
        extra = {"target_nodes": RedisCluster.PRIMARIES} if self.cluster else {}
        n = len(self.prefix)
        with _reachable(self.url):
            for raw in self.client.scan_iter(match=match, count=1000, **extra):
                yield raw[n:].decode()

    def close(self) -> None:
        self.client.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)


@contextmanager
def _reachable(url: str):
    """Turns any failure to reach Redis into StoreUnavailable, one line: 'cannot reach Redis at URL: why'."""
    try:
        yield
    except _UNREACHABLE as e:
        raise StoreUnavailable(f"cannot reach Redis at {url}: {_reason(e)}") from e


def _reason(e: BaseException) -> str:
    """The shortest true account of a redis error: the OS's words when there are some ('Connection
    refused', 'timed out'), else the first line of the error."""
    inner: BaseException | None = e
    while inner is not None:
        if isinstance(inner, OSError) and (inner.strerror or str(inner)):
            return inner.strerror or str(inner)
        inner = inner.__cause__ or inner.__context__
    lines = str(e).strip().splitlines()
    return lines[0].rstrip(".") if lines else type(e).__name__


def public_url(url: str) -> str:
    """`url` without password and query: what messages may show."""
    parts = urlsplit(url)
    user, _, hosts = parts.netloc.rpartition("@")
    user = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{hosts}" if user else hosts, query="", fragment=""))


def _cluster_netloc(netloc: str) -> tuple[str | None, str | None, list[tuple[str, int]]]:
    """(user, password, [(host, port)...]) of `[[user]:password@]host:port[,host:port...]`."""
    auth, _, hosts = netloc.rpartition("@")
    user, _, password = auth.partition(":")
    nodes = []
    for node in hosts.split(","):
        if node.startswith("["):  # [::1]:7000
            host, _, port = node[1:].partition("]")
            port = port.lstrip(":")
        else:
            host, _, port = node.partition(":")
        if not host:
            raise ValueError(f"redis+cluster://{hosts}: a node without a host")
        nodes.append((host, int(port or 6379)))
    return unquote(user) or None, unquote(password) or None, nodes


def _glob_escape(text: str) -> str:
    """`text` matched literally by a Redis glob (SCAN MATCH)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
