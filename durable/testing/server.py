"""A real Redis server for tests: the embedded ``redis-server`` on a random port, in a
private directory. ``kill`` is a ``kill -9``; ``restart`` brings it back on the same port
and data (what a crash of Redis looks like to the processes that use it)."""

from __future__ import annotations

import signal
import subprocess
import tempfile
from pathlib import Path

import redis

from durable.backend import embedded


class Server:
    def __init__(self, fsync: str = "always", data_dir: Path | None = None) -> None:
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="durable-redis-")
        self.data_dir = data_dir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.fsync = fsync
        self.port = embedded.free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._clients: list[redis.Redis] = []

    def start(self) -> Server:
        self.url, self.proc = embedded.start(self.data_dir, self.fsync, self.port)
        return self

    def client(self) -> redis.Redis:
        """A client of this server, closed when the server stops."""
        client = redis.Redis.from_url(self.url)
        self._clients.append(client)
        return client

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> Server:
        """``kill -9``, then start again on the same port with the same data."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
