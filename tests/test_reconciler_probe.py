"""The reconciler's probe (``durable reconciler --probe-port``): healthy while its sweep loop
goes round, 503 once a tool's ``lookup`` wedges it, healthy again when the lookup returns;
its own metrics beside. Real reconciler and worker processes, a real SQLite world."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from durable.backend.embedded import free_port
from durable.client import Client
from durable.testing import Reconciler, Server, wait_for
from tests.agents.basic import applications
from tests.conftest import WorkerFactory


def _health(url: str) -> tuple[int, dict[str, Any]]:
    try:
        reply = httpx.get(url + "/healthz", timeout=2)
    except httpx.HTTPError:
        return 0, {}
    return reply.status_code, reply.json()


def test_the_probe_fails_while_a_lookup_wedges_the_sweep_and_recovers_after(
    server: Server, client: Client, worker: WorkerFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, world_db: Path,
) -> None:
    """Window: the reconciler asks the lookup of a lost reply and the authoritative system
    never answers. The sweep loop stops going round, /healthz turns 503 after
    ``--stale-after-s``; once the lookup answers, the step is settled as applied (not sent
    again) and /healthz is 200 again."""
    down, hang = tmp_path / "down", tmp_path / "hang"
    down.write_text("x")
    monkeypatch.setenv("TEST_LOOKUP_DOWN", str(down))
    monkeypatch.setenv("TEST_LOOKUP_HANG", str(hang))
    run = client.start("unsure", {"steps": 1}, run_id="wedge").run_id
    w = worker()
    assert wait_for(lambda: client.status(run).state == "outcome_unknown", 20), \
        client.status(run).state
    w.stop()
    hang.write_text("x")
    down.unlink()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    rec = Reconciler(server.url, interval=0.1, log_path=tmp_path / "rec.log",
                     args=["--probe-port", str(port), "--stale-after-s", "1.5"])
    try:
        assert wait_for(lambda: _health(url)[0] == 503, 30), _health(url)
        code, body = _health(url)
        assert code == 503, body
        assert body["ok"] is False and body["last_beat_age_s"] >= 1.5, body
        assert client.status(run).state == "outcome_unknown"  # still asking
        hang.unlink()
        assert wait_for(lambda: client.status(run).actions[1].resolution == "applied", 20)
        assert wait_for(lambda: _health(url)[0] == 200, 10), _health(url)
        metrics = httpx.get(url + "/metrics", timeout=2).text
        assert "durable_reconciler_sweeps_total" in metrics
        assert "durable_reconciler_last_beat_age_seconds" in metrics
        assert httpx.get(url + "/nope", timeout=2).status_code == 404
    finally:
        rec.stop()
    assert applications(str(world_db)) == {"wedge:1": 1}
    assert "Traceback" not in (tmp_path / "rec.log").read_text()


def test_a_probe_port_in_use_stops_the_reconciler_with_one_line(
    server: Server, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rec = Reconciler(server.url, log_path=tmp_path / "rec.log",
                         args=["--probe-port", str(port)])
        assert rec.wait(30) != 0
    text = (tmp_path / "rec.log").read_text()
    assert f"--probe-port: cannot listen on 127.0.0.1:{port}" in text, text
    assert "Traceback" not in text
