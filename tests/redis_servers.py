"""Real Redis servers for tests: a single `redis-server` and a 3-master Redis Cluster on loopback ports.

Tests talk to real servers, not a fake, because what matters (pipelining, slots spread over shards, what a
dead or hung server does to the client) is exactly what a fake gets wrong. Each server runs in a temp dir
with persistence off, and dies with the test process (PR_SET_PDEATHSIG), so a killed pytest leaks nothing.

Use the fixtures from a test module with `from redis_servers import redis_cluster, redis_server  # noqa`.
They are session-scoped and backed by one module-level instance each, so however many modules import them,
the suite starts each server once. `RedisServer` and `RedisClusterServers` can also be started directly for
a test that breaks its server (stops, pauses it).

Without `redis-server`/`redis-cli` on PATH or the `redis` package, the fixtures skip with the reason; when
the environment variable CI is set they fail instead, because CI installs them.
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

START_TIMEOUT = 10.0  # seconds for a server to answer PING, and for a cluster to reach cluster_state:ok


def require_redis() -> None:
    """Skip (fail under CI) unless redis-server, redis-cli and the `redis` package are all there."""
    missing = [name for name in ("redis-server", "redis-cli") if shutil.which(name) is None]
    try:
        import redis  # noqa: F401
    except ImportError:
        missing.append("the redis package (pip install 'turborag[redis]')")
    if missing:
        reason = "Redis tests need " + ", ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI is set, so this is a failure, not a skip)")
        pytest.skip(reason)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: teardown (or atexit) still stops the servers


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(cluster: bool = False) -> int:
    """A loopback port nobody listens on; for a cluster node also port + 10000 (its bus port), so the
    port must stay below 55536."""
    for _ in range(200):
        port = random.randint(20000, 45000)
        if _port_free(port) and (not cluster or _port_free(port + 10000)):
            return port
    raise RuntimeError("no free port")


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One `redis-server` process on 127.0.0.1:`port`, persistence off, its files in `workdir`."""

    def __init__(self, workdir: str | Path | None = None, port: int | None = None, cluster: bool = False):
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="turborag-redis-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cluster = cluster
        self.port = port or free_port(cluster)
        self._picked_port = port is None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING. A first start on a port picked here tries new
        ports when it loses a race for one; a restart keeps its port (the clients know it)."""
        for attempt in range(3):
            try:
                return self._start()
            except RuntimeError:
                if self._picked_port and attempt < 2:
                    self.port = free_port(self.cluster)
                else:
                    raise
        raise AssertionError("unreachable")

    def _start(self) -> RedisServer:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir)]
        args += ["--save", "", "--appendonly", "no", "--logfile", "redis.log"]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            args += ["--cluster-node-timeout", "5000"]
        self.proc = subprocess.Popen(args, preexec_fn=_die_with_parent, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while not _ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                path = self.workdir / "redis.log"
                log = path.read_text(errors="replace")[-2000:] if path.exists() else "(no log)"
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start:\n{log}")
            time.sleep(0.02)
        self._picked_port = False
        return self

    def stop(self) -> None:
        """Kill the server (idempotent). SIGKILL: its data is throwaway, and it is what a crash looks like."""
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            self.proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets but never answers, like a hung host."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, timeout=10
        )
        return out.stdout


class RedisClusterServers:
    """`masters` cluster-enabled servers joined into one cluster with no replicas."""

    def __init__(self, workdir: str | Path | None = None, masters: int = 3):
        root = Path(workdir or tempfile.mkdtemp(prefix="turborag-redis-cluster-"))
        self.nodes = [RedisServer(root / f"node{i}", cluster=True) for i in range(masters)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> RedisClusterServers:
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
            create = subprocess.run(
                ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if create.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{create.stdout}\n{create.stderr}")
            deadline = time.monotonic() + START_TIMEOUT
            while not all("cluster_state:ok" in n.cli("cluster", "info") for n in self.nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


# -- fixtures: one instance each per test session ----------------------------------------------------------

_shared: dict[str, RedisServer | RedisClusterServers] = {}


def _started(name: str, make) -> RedisServer | RedisClusterServers:
    if name not in _shared:
        t0 = time.monotonic()
        _shared[name] = make().start()
        print(f"\n[redis_servers] {name} started in {time.monotonic() - t0:.2f} s: {_shared[name].url}")
    return _shared[name]


def _stop(name: str) -> None:
    """Stop a shared instance; a no-op for the second module that imported the same fixture."""
    servers = _shared.pop(name, None)
    if servers is not None:
        servers.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A running single Redis (`.url` is redis://127.0.0.1:<port>/0), shared by the whole session."""
    require_redis()
    yield _started("redis", lambda: RedisServer(tmp_path_factory.mktemp("redis")))
    _stop("redis")


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A running 3-master Redis Cluster (`.url` is redis+cluster://h:p,h:p,h:p), shared by the session."""
    require_redis()
    yield _started("cluster", lambda: RedisClusterServers(tmp_path_factory.mktemp("redis-cluster")))
    _stop("cluster")
