"""Bringing back the runs of a dead worker: a ``durable reconciler`` process for the scene."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from durable.testing import env_for


class Recovery:
    """A reconciler process with the scene's environment; ``stop`` ends it."""

    mode = "reconciler"

    def __init__(self, redis_url: str, env: dict[str, str], *, interval: float = 0.2,
                 log_path: Path | None = None) -> None:
        self.redis_url, self.env = redis_url, env
        self.interval, self.log_path = interval, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Recovery:
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "durable", "reconciler", "--interval",
                 str(self.interval)], env=env_for(self.redis_url, **self.env),
                stdout=out, stderr=out, start_new_session=True)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # type: ignore[union-attr]
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
