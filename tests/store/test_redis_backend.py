"""The Redis backend against real servers (tests/redis_servers.py): a single Redis and a 3-master cluster.

What it must keep: blobs bit-identical to the file store's, one round trip per request however many chunks,
chunks spread over the cluster's shards, damage caught like a damaged file, and every fault (server
stopped, hung, never there) a one-line StoreUnavailable within seconds, never a hang.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from redis_servers import (  # noqa: F401 (fixtures)
    RedisClusterServers,
    RedisServer,
    free_port,
    redis_cluster,
    redis_server,
    require_redis,
)

from turborag.store import codec, redis_backend
from turborag.store.chunk_kv import ChunkKV
from turborag.store.errors import StoreUnavailable
from turborag.store.kv_store import KVStore, cache_key
from turborag.store.urls import open_backend

try:
    import redis.connection
except ImportError:  # the tests that need it skip (or fail under CI) through require_redis
    redis = None


def _kv(seed: int = 0, layers: int = 4, tokens: int = 7) -> ChunkKV:
    g = torch.Generator().manual_seed(seed)
    shape = (layers, 2, tokens, 8)  # (L, H, T, D)
    return ChunkKV(torch.randn(shape, generator=g), torch.randn(shape, generator=g))


def _key(i: int) -> str:
    return cache_key("test-model", [1, 2], [i], "float32")


@pytest.fixture
def opened():
    """open_backend(url) for a test; closes every backend it opened at teardown."""
    backends = []

    def open_(url: str):
        backends.append(open_backend(url))
        return backends[-1]

    yield open_
    for b in backends:
        b.close()


@pytest.fixture(params=["single", "cluster"])
def url(request) -> str:
    """The URL of the shared single Redis or cluster, emptied for this test."""
    servers = request.getfixturevalue("redis_server" if request.param == "single" else "redis_cluster")
    b = open_backend(servers.url)
    b.client.flushall(**({"target_nodes": b.client.PRIMARIES} if b.cluster else {}))
    b.close()
    return servers.url


# -- round trips -------------------------------------------------------------------------------------------


def test_round_trip_bit_identical_to_file_store(url, opened, tmp_path):
    files = KVStore(tmp_path, "float32")
    remote = KVStore(opened(url), "float32")
    for i in range(3):
        kv = _kv(seed=i, tokens=5 + i)
        assert remote.put(_key(i), kv) == files.put(_key(i), kv)
        back, ref = remote.get(_key(i)), files.get(_key(i))
        assert torch.equal(back.k, ref.k) and torch.equal(back.v, ref.v)
        assert torch.equal(back.k, kv.k) and torch.equal(back.v, kv.v)
    # The value is the blob as it is (two encodes may order the header differently, so one blob in both).
    blob = codec.encode(_kv(seed=7), torch.float32)
    remote.backend.put(_key(7), blob)
    files.backend.put(_key(7), blob)
    assert remote.backend.get(_key(7)) == bytearray(blob) == files.path(_key(7)).read_bytes()
    assert remote.get(_key(99)) is None and remote.misses == 1


def test_get_many_layers_is_one_round_trip(url, opened, monkeypatch):
    backend = opened(url)
    store = KVStore(backend, "float32")
    kvs = {_key(i): _kv(seed=i) for i in range(40)}
    for key, kv in kvs.items():
        store.put(key, kv)
    wanted = {key: [0, 3] for key in kvs} | {_key(1000): [0]}  # 40 present, 1 missing
    store.get_many_layers(wanted)  # warm the connection pools: a new connection sends its own handshake

    calls = {"get": 0, "get_many": 0, "send_packed_command": 0}

    def counting(name, method):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return method(*args, **kwargs)

        return wrapper

    for name in ("get", "get_many"):
        monkeypatch.setattr(backend, name, counting(name, getattr(backend, name)))
    conn = redis.connection.AbstractConnection  # every write of a request (or a pipeline) to a socket
    monkeypatch.setattr(
        conn, "send_packed_command", counting("send_packed_command", conn.send_packed_command)
    )
    got = store.get_many_layers(wanted)

    # One request to the backend; on the wire one write per server (1, or at most one per master).
    assert calls["get"] == 0 and calls["get_many"] == 1
    assert 1 <= calls["send_packed_command"] <= (3 if backend.cluster else 1)
    assert got[_key(1000)] is None
    for key, kv in kvs.items():
        layers = got[key]
        assert layers[1] is None and layers[2] is None
        for i in (0, 3):
            assert torch.equal(layers[i][0], kv.k[i]) and torch.equal(layers[i][1], kv.v[i])


def test_open_many_reads_redis_values_in_place(url, opened):
    """Serving assembly's read in place (KVStore.open_many) from Redis values: one round trip, then each
    tensor copied from the value straight into the tensor given, checked; a damaged value is deleted."""
    store = KVStore(opened(url), "float32")
    kvs = {_key(i): _kv(seed=i) for i in range(3)}
    for key, kv in kvs.items():
        store.put(key, kv)
    blob = bytearray(store.backend.get(_key(2)))
    blob[-2] ^= 1  # inside the last tensor, v.3
    store.backend.put(_key(2), bytes(blob))
    found = store.open_many({key: [0, 3] for key in kvs})
    for key in (_key(0), _key(1)):
        for i in (0, 3):
            for kind, want in (("k", kvs[key].k[i]), ("v", kvs[key].v[i])):
                out = torch.empty(2, 7, 8)
                found[key].read_into(i, kind, out)
                assert torch.equal(out, want)
    found[_key(2)].read_into(3, "k", torch.empty(2, 7, 8))  # a sound tensor of the damaged value
    with pytest.raises(codec.Damaged):
        found[_key(2)].read_into(3, "v", torch.empty(2, 7, 8))
    assert _key(2) not in store


def test_keys_spread_over_cluster_masters(redis_cluster, opened):  # noqa: F811
    backend = opened(redis_cluster.url)
    backend.client.flushall(target_nodes=backend.client.PRIMARIES)
    keys = [_key(i) for i in range(50)]
    for key in keys:
        backend.put(key, b"blob " + key.encode())
    per_master = [int(node.cli("dbsize")) for node in redis_cluster.nodes]
    assert sum(per_master) == 50
    assert sum(n > 0 for n in per_master) >= 2, per_master
    assert sorted(backend.keys()) == sorted(keys)  # SCAN covers every master
    assert backend.get_many(keys) == {k: bytearray(b"blob " + k.encode()) for k in keys}


def test_keys_size_delete_agree(url, opened):
    backend = opened(url)
    blobs = {_key(i): bytes([i]) * (100 + i) for i in range(3)}
    for key, blob in blobs.items():
        assert backend.put(key, blob) == len(blob)
    backend.client.set("someone-else:" + _key(0), b"not ours")  # other keys in the same Redis are ignored
    assert sorted(backend.keys()) == sorted(blobs)
    for key, blob in blobs.items():
        assert key in backend and backend.size(key) == len(blob)
    gone = _key(0)
    assert backend.delete(gone) == len(blobs[gone])
    assert backend.delete(gone) == 0
    assert gone not in backend and backend.size(gone) is None and backend.get(gone) is None
    assert sorted(backend.keys()) == sorted(set(blobs) - {gone})
    assert backend.get_many([]) == {}


def test_prefix_option_and_password_free_url(url, opened):
    plain = opened(url)
    odd = opened(url + "?prefix=t[1]*:")  # glob characters in the prefix are matched literally
    assert odd.url == url and odd.prefix == "t[1]*:"
    plain.put(_key(0), b"a")
    odd.put(_key(1), b"b")
    assert list(odd.keys()) == [_key(1)] and list(plain.keys()) == [_key(0)]
    assert redis_backend.public_url("redis://user:hunter2@h:1/0?timeout=1") == "redis://user@h:1/0"
    assert redis_backend.public_url("redis+cluster://:pw@a:1,b:2") == "redis+cluster://a:1,b:2"
    assert redis_backend._cluster_netloc("u:p%40ss@a:7000,[::1]:7001,b") == (
        "u",
        "p@ss",
        [("a", 7000), ("::1", 7001), ("b", 6379)],
    )


def test_damaged_value_detected_deleted_and_missing(url, opened):
    backend = opened(url)
    store = KVStore(backend, "float32")
    for key in (_key(0), _key(1)):
        store.put(key, _kv())
        raw = backend.prefix + key
        blob = bytearray(backend.client.get(raw))
        blob[-5] ^= 0xFF  # flip bits in the last tensor's data
        backend.client.set(raw, bytes(blob))
    assert store.get(_key(0)) is None
    assert store.get_many_layers({_key(1): [3]}) == {_key(1): None}
    assert _key(0) not in backend and _key(1) not in backend and store.misses == 2


def test_concurrent_puts_of_overlapping_keys_lose_nothing(url, opened):
    blobs = {_key(i): f"blob {i} ".encode() * 200 for i in range(120)}
    keys = list(blobs)
    writers = [opened(url), opened(url)]  # two clients, as two processes would have
    errors = []

    def put_all(backend, part):
        try:
            for key in part:
                backend.put(key, blobs[key])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [
        threading.Thread(target=put_all, args=(writers[0], keys[:80])),
        threading.Thread(target=put_all, args=(writers[1], keys[40:][::-1])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert writers[0].get_many(keys) == {k: bytearray(v) for k, v in blobs.items()}
    assert sorted(writers[1].keys()) == sorted(keys)


def test_usable_in_a_forked_child(url, opened):
    """A server may fork its workers after opening the store: in the child the connection pools (and the
    threads that read a cluster's shards) start afresh instead of sharing the parent's."""
    backend = opened(url)
    backend.get_many([_key(0), _key(1)])  # the parent's connections and threads exist before the fork
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            signal.alarm(20)  # a hang kills the child (SIGALRM), which fails the test below
            backend.put(_key(1), b"from the child")
            code = 0 if backend.get_many([_key(0), _key(1)]) == {_key(1): bytearray(b"from the child")} else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert backend.get(_key(1)) == bytearray(b"from the child")


# -- faults ------------------------------------------------------------------------------------------------


def _fails_fast(op, limit: float = 5.0) -> str:
    """Runs `op`, which must raise StoreUnavailable within `limit` seconds; returns the message."""
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        op()
    assert time.monotonic() - t0 < limit, f"took {time.monotonic() - t0:.1f} s"
    message = str(info.value)
    assert "\n" not in message
    return message


def _every_op(backend) -> dict:
    key = _key(0)
    return {
        "get": lambda: backend.get(key),
        "get_many": lambda: backend.get_many([_key(i) for i in range(20)]),
        "put": lambda: backend.put(key, b"x"),
        "delete": lambda: backend.delete(key),
        "size": lambda: backend.size(key),
        "contains": lambda: key in backend,
        "keys": lambda: list(backend.keys()),
    }


def test_open_dead_port_is_one_line_store_unavailable():
    require_redis()
    port = free_port()
    message = _fails_fast(lambda: open_backend(f"redis://:hunter2@127.0.0.1:{port}/0"), limit=3)
    assert message == f"cannot reach Redis at redis://127.0.0.1:{port}/0: Connection refused"
    message = _fails_fast(lambda: open_backend(f"redis+cluster://127.0.0.1:{port},127.0.0.1:{port}"), limit=3)
    assert (
        message
        == f"cannot reach Redis at redis+cluster://127.0.0.1:{port},127.0.0.1:{port}: Connection refused"
    )


def test_single_redis_stopped_mid_way_then_back(tmp_path, opened):
    require_redis()
    server = RedisServer(tmp_path).start()
    try:
        backend = opened(server.url)
        store = KVStore(backend, "float32")
        store.put(_key(0), _kv())
        server.stop()
        for name, op in _every_op(backend).items():
            message = _fails_fast(op)
            assert message == f"cannot reach Redis at {server.url}: Connection refused", name
        server.start()  # same port, empty (no persistence): the pooled connections are stale
        assert store.get(_key(0)) is None
        store.put(_key(0), _kv())
        assert torch.equal(store.get(_key(0)).k, _kv().k)
    finally:
        server.stop()


def test_hung_redis_times_out(tmp_path, opened):
    require_redis()
    server = RedisServer(tmp_path).start()
    try:
        backend = opened(server.url + "?timeout=0.5&connect_timeout=0.5")
        backend.put(_key(0), b"x")
        server.pause()  # accepts connections (the kernel does), never answers
        for name, op in _every_op(backend).items():
            assert _fails_fast(op, limit=4).endswith(": timed out"), name
        _fails_fast(lambda: open_backend(server.url + "?timeout=0.5&connect_timeout=0.5"), limit=4)
        server.resume()
        assert backend.get(_key(0)) == bytearray(b"x")
    finally:
        server.stop()


def test_cluster_master_hung_then_stopped(tmp_path, opened):
    """One master of three: a request whose chunks touch it fails within the timeout, not one per chunk."""
    require_redis()
    cluster = RedisClusterServers(tmp_path).start()
    try:
        backend = opened(cluster.url + "?timeout=0.5&connect_timeout=0.5")
        keys = [_key(i) for i in range(30)]
        for key in keys:
            backend.put(key, b"x")
        victim = cluster.nodes[1]
        on_victim = [
            k for k in keys if backend.client.get_node_from_key(backend.prefix + k).port == victim.port
        ]
        assert on_victim
        victim.pause()
        _fails_fast(lambda: backend.get_many(keys), limit=4)
        _fails_fast(lambda: backend.get(on_victim[0]), limit=4)
        victim.resume()
        assert len(backend.get_many(keys)) == 30
        victim.stop()
        for op in (
            lambda: backend.get_many(keys),
            lambda: backend.get(on_victim[0]),
            lambda: backend.put(on_victim[0], b"y"),
            lambda: list(backend.keys()),
        ):
            assert _fails_fast(op).endswith(": Connection refused")
    finally:
        cluster.stop()


def test_missing_redis_package_names_the_extra(monkeypatch):
    monkeypatch.setattr(redis_backend, "redis", None)
    with pytest.raises(ImportError, match=r"pip install 'turborag\[redis\]'"):
        open_backend("redis://:secret@127.0.0.1:1/0")
