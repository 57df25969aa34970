"""Python helpers for the world: control and inspection (``WorldClient``), and the world as
a subprocess on a random free port (``WorldProcess``) for tests, scenarios and the demo.

The example's tools do not use these: they speak HTTP themselves, as an agent author's
tools would (see ``examples.agents.pipeline``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from examples.world.protocol import Applications


class WorldClient:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _get(self, path: str, **params: str) -> Any:
        resp = self.http.get(path, params=params or None)
        resp.raise_for_status()
        return resp.json()

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        resp = self.http.post(path, json=body or {})
        resp.raise_for_status()
        return resp.json()

    def health(self) -> bool:
        try:
            return bool(self._get("/health").get("ok"))
        except httpx.HTTPError:
            return False

    def info(self) -> dict[str, Any]:
        return dict(self._get("/info"))

    def applications(self, run_id: str | None = None) -> Applications:
        """Applications per key in the API and the database (one run's keys, or all)."""
        params = {"prefix": f"{run_id}:"} if run_id else {}
        return Applications.from_json(self._get("/applications", **params))

    def application_rows(self, run_id: str | None = None) -> list[dict[str, Any]]:
        params = {"prefix": f"{run_id}:"} if run_id else {}
        return list(self._get("/applications/rows", **params)["rows"])

    def requests(self, key: str) -> list[dict[str, Any]]:
        return list(self._get("/requests", key=key)["requests"])

    def lookup(self, key: str) -> dict[str, Any]:
        return dict(self._get(f"/notify/{quote(key, safe='')}"))

    def faults(self) -> dict[str, Any]:
        return dict(self._get("/control/faults"))

    def set_faults(self, **plan: Any) -> dict[str, Any]:
        """E.g. ``set_faults(target="notify", fail_next=2)``; see ``examples.world.faults``."""
        return dict(self._post("/control/faults", plan))

    def reset_faults(self) -> dict[str, Any]:
        return dict(self._post("/control/reset"))

    def injected(self) -> dict[str, int]:
        return dict(self.faults()["injected"])


class WorldProcess:
    """``python -m examples.world`` on a free loopback port, in a private directory."""

    def __init__(self, *, dedupe: bool = True, data_dir: Path | None = None,
                 log_path: Path | None = None) -> None:
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="durable-world-")
        self.data_dir = data_dir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.dedupe = dedupe
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.db_path = ""
        self._client: WorldClient | None = None

    def start(self, timeout: float = 20.0) -> WorldProcess:
        ready = self.data_dir / "ready.json"
        ready.unlink(missing_ok=True)
        args = [sys.executable, "-m", "examples.world", "--port", "0", "--data-dir",
                str(self.data_dir), "--ready-file", str(ready), "--quiet"]
        if not self.dedupe:
            args.append("--no-dedupe")
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(args, stdout=out, stderr=out, start_new_session=True)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # type: ignore[union-attr]
        end = time.monotonic() + timeout
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the world exited with {self.proc.returncode}"
                                   + (f"; see {self.log_path}" if self.log_path else ""))
            if time.monotonic() > end:
                self.stop()
                raise RuntimeError("the world did not start in time")
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        self.url, self.db_path = info["url"], info["db"]
        self._client = WorldClient(self.url)
        return self

    @property
    def client(self) -> WorldClient:
        if self._client is None:
            raise RuntimeError("the world is not started")
        return self._client

    def env(self) -> dict[str, str]:
        """What child processes need to find the world, and its model (``durable.models``)."""
        return {"DURABLE_WORLD_URL": self.url, "DURABLE_MODEL_BASE_URL": f"{self.url}/v1",
                "DURABLE_MODEL_NAME": "scripted"}

    def applications(self, run_id: str | None = None) -> Applications:
        return self.client.applications(run_id)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> WorldProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
