"""The deploy gate: ``durable deploy check --agents MODULE`` replays every run in flight of
the module's agents against the code imported now, sends nothing, and exits 1 naming the
runs that would diverge and their first differing step. Real Redis, real worker processes
(killed to leave runs in flight), the real CLI."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from durable.client import Client
from tests.conftest import WorkerFactory, run_durable


@pytest.fixture(autouse=True)
def _db_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_DB", str(tmp_path / "world.sqlite"))


def _check(module: str, **env: str) -> tuple[int, list[dict[str, object]], str]:
    done = run_durable("deploy", "check", "--agents", module, "--json",
                       env={**os.environ, **env})
    return done.returncode, [json.loads(x) for x in done.stdout.splitlines()], done.stderr


def test_a_changed_code_agent_is_flagged_and_an_unchanged_one_passes(
    client: Client, worker: WorkerFactory
) -> None:
    """Window: killed after step 3's intent (recorded, not sent), the run is in flight.
    Code whose third call differs is flagged at step 3, with the argument that differs;
    the same code passes. Nothing is sent either way: the log does not move."""
    run = client.start("variant", {}, run_id="dc-code").run_id
    assert worker(kill_at="after_intent:3", CODE_VARIANT="a").wait(30) == -signal.SIGKILL
    version = client.status(run).version
    rc, verdicts, err = _check("tests.agents.code", CODE_VARIANT="b")
    assert rc == 1, err
    (flagged,) = [v for v in verdicts if v["run_id"] == run]
    assert flagged["outcome"] == "diverges" and flagged["step"] == 3
    assert "'n': 3 recorded, 33 now" in str(flagged["detail"]), flagged
    rc, verdicts, err = _check("tests.agents.code", CODE_VARIANT="a")
    assert rc == 0, err
    assert [v["outcome"] for v in verdicts if v["run_id"] == run] == ["same"]
    assert client.status(run).version == version


def test_a_changed_decide_agent_is_flagged_and_a_waiting_run_passes(
    client: Client, worker: WorkerFactory
) -> None:
    """A ``decide()`` agent whose arguments now differ (``ECHO_SLEEP``) is flagged at its
    first step; a run waiting for input replays the same; the table says how many."""
    echo = client.start("echo", {"steps": 4, "text": "x"}, run_id="dc-echo").run_id
    assert worker(kill_at="after_intent:2").wait(30) == -signal.SIGKILL
    asker = client.start("asker", {}, run_id="dc-ask").run_id
    w = worker()
    assert client.wait(asker, 20).state == "waiting_input"
    w.stop()
    rc, verdicts, err = _check("tests.agents.basic", ECHO_SLEEP="5")
    assert rc == 1, err
    outcomes = {v["run_id"]: (v["outcome"], v["step"]) for v in verdicts}
    assert outcomes[echo] == ("diverges", 1) and outcomes[asker] == ("same", 0)
    shown = run_durable("deploy", "check", "--agents", "tests.agents.basic",
                        env={**os.environ, "ECHO_SLEEP": "5", "COLUMNS": "200"})
    assert shown.returncode == 1
    assert "would diverge" in shown.stdout and echo in shown.stdout


def test_a_module_with_no_agent_is_a_usage_error(client: Client) -> None:
    done = run_durable("deploy", "check", "--agents", "durable.settings", env=dict(os.environ))
    assert done.returncode == 2 and "defines no agent" in done.stderr
