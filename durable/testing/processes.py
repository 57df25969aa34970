"""Processes for tests, scenarios, the demo and benchmarks: real ``durable worker`` and
``durable reconciler`` processes that can be SIGKILLed, paused or stopped, a worker
optionally with a crash window to die in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from durable.testing import forks

#: The hook that kills a worker at a crash window (``durable.testing.faults``).
KILL_AT_HOOK = "durable.testing.faults:KillAt"


def env_for(url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DURABLE_REDIS_URL"] = url
    env.update(extra)
    return env


class Process:
    """A ``durable`` subcommand in a process of its own session (so a test can SIGKILL,
    SIGSTOP or SIGTERM it alone), with ``env`` and the variables given as keywords
    (``DURABLE_CONCURRENCY="8"``; they win) added to its environment. ``env`` is for a
    mapping built elsewhere: unpacked as keywords, its names could collide with options."""

    def __init__(self, url: str, args: Sequence[str], *, log_path: Path | None = None,
                 env: Mapping[str, str] | None = None, **variables: str) -> None:
        self.log_path = log_path
        full = env_for(url, **{**(env or {}), **variables})
        self.proc: subprocess.Popen[bytes] | forks.Forked
        if forks.forking():  # a test suite's: forked from a server that imported the library
            if log_path is not None:
                log_path.touch()  # there when this returns, as the other way
            self.proc = forks.Forked(args, full, stdout=log_path, stderr=log_path)
        elif log_path is None:
            self.proc = subprocess.Popen([sys.executable, "-m", "durable", *args], env=full,
                                         stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
        else:
            with open(log_path, "ab") as out:  # the child keeps its own copy
                self.proc = subprocess.Popen([sys.executable, "-m", "durable", *args],
                                             env=full, stdout=out, stderr=out,
                                             start_new_session=True)

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

    def send(self, signum: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, signum)

    def stop(self, timeout: float = 5.0) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def started(self, timeout: float = 30.0) -> bool:
        """Wait until the process has logged that it started (its log has the line), and
        tell whether it did within ``timeout`` seconds; needs ``log_path``."""
        if self.log_path is None:
            raise ValueError("started() reads the process's log: give it a log_path")
        path = self.log_path
        return wait_for(lambda: b" started: " in path.read_bytes(), timeout, 0.05)


class Worker(Process):
    """A ``durable worker`` process.

    ``kill_at="<window>:<step>"`` makes it SIGKILL itself there (see
    ``durable.testing.faults``); ``hooks`` adds other step hooks; ``metrics_port`` serves
    its own metrics there; ``env`` and the keywords ``DURABLE_*=...`` are added to the
    environment (as ``Process``'s).
    """

    def __init__(self, url: str, *, burst: bool = False, queue: str | None = None,
                 log_path: Path | None = None, kill_at: str | None = None,
                 hooks: Sequence[str] = (), metrics_port: int | str | None = None,
                 env: Mapping[str, str] | None = None, **variables: str) -> None:
        args = ["worker"]
        if burst:
            args.append("--burst")
        if metrics_port is not None:
            args += ["--metrics-port", str(metrics_port)]
        if queue:
            args += ["--queue", queue]
        if kill_at:
            args += ["--hook", f"{KILL_AT_HOOK}={kill_at}"]
        for hook in hooks:
            args += ["--hook", hook]
        super().__init__(url, args, log_path=log_path, env=env, **variables)


class Reconciler(Process):
    """A ``durable reconciler`` process sweeping every ``interval`` seconds; ``args`` are
    more of its command line options (``--probe-port``...); its environment as
    ``Process``'s."""

    def __init__(self, url: str, *, interval: float = 0.2, log_path: Path | None = None,
                 args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 **variables: str) -> None:
        super().__init__(url, ["reconciler", "--interval", str(interval), *args],
                         log_path=log_path, env=env, **variables)


def wait_for(predicate: Callable[[], object], timeout: float = 10.0,
             interval: float = 0.01) -> bool:
    """Poll ``predicate`` until it is true (True) or ``timeout`` seconds pass (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return False
