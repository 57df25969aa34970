"""Real processes for tests, scenarios, the demo and benchmarks: an embedded Redis server on
a random port in its own directory, and ``durable worker`` processes that can be SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from durable import embedded


class Server:
    """A real redis-server in a private directory; ``kill`` is a kill -9."""

    def __init__(self, fsync: str = "always", data_dir: Path | None = None) -> None:
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="durable-redis-")
        self.data_dir = data_dir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.fsync = fsync
        self.port = embedded.free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Server:
        self.url, self.proc = embedded.start(self.data_dir, self.fsync, self.port)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def env_for(url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DURABLE_REDIS_URL"] = url
    env.update(extra)
    return env


class Worker:
    """A ``durable worker`` process (``python -m durable worker``)."""

    def __init__(self, url: str, *, burst: bool = False, queue: str | None = None,
                 log_path: Path | None = None, **env: str) -> None:
        args = [sys.executable, "-m", "durable", "worker"]
        if burst:
            args.append("--burst")
        if queue:
            args += ["--queue", queue]
        self.log_path = log_path
        if log_path is None:
            self.proc = subprocess.Popen(args, env=env_for(url, **env),
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
        else:
            with open(log_path, "ab") as out:  # the child keeps its own copy
                self.proc = subprocess.Popen(args, env=env_for(url, **env), stdout=out,
                                             stderr=out, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no lease release, no last write."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 5.0) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)


def wait_for(predicate: object, timeout: float = 10.0, interval: float = 0.01) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if callable(predicate) and predicate():
            return True
        time.sleep(interval)
    return False
