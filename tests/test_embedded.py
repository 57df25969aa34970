"""Finding the embedded server: one per user from any directory, never a foreign one, and
a taken port is an error the user sees."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from durable.backend import embedded
from durable.settings import Settings
from tests.conftest import ServerFactory, run_durable


def _durable(args: list[str], cwd: Path, env: dict[str, str],
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_durable(*args, env=env, cwd=cwd, timeout=timeout)


@pytest.fixture()
def user_env(tmp_path: Path) -> dict[str, str]:
    """A user's environment with no server named: the per-user state dir is under tmp."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["DURABLE_AGENTS"] = "examples.agents"
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)  # examples: not installed
    return env


def test_every_directory_finds_the_same_server(tmp_path: Path,
                                               user_env: dict[str, str]) -> None:
    """`durable start` in one folder, `durable runs` in another: the same server, and only
    the command that had to start one says so."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    try:
        first = _durable(["start", "count", "--run-id", "r1", "--input", '{"steps": 1}'],
                         here, user_env)
        assert first.returncode == 0, first.stderr
        assert "started one at redis://127.0.0.1:" in first.stderr
        second = _durable(["runs", "--json"], there, user_env)
        assert second.returncode == 0, second.stderr
        assert [json.loads(line)["run_id"] for line in second.stdout.splitlines()] == ["r1"]
        assert "started" not in second.stderr
        assert (tmp_path / "state" / "durable" / embedded.ADDRESS_FILE).exists()
    finally:
        assert _durable(["redis", "--stop"], there, user_env).returncode == 0


def test_a_recorded_address_now_served_by_another_server_is_not_used(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    """The recorded port is now held by a foreign redis-server (another process id): the
    client starts its own instead of writing into the foreign one."""
    foreign = make_server(fsync="everysec")
    foreign.client().set("foreign", "1")
    data = tmp_path / "data"
    data.mkdir()
    (data / embedded.ADDRESS_FILE).write_text(json.dumps({"url": foreign.url, "pid": 1}))
    assert embedded.recorded_url(data) is None
    url = embedded.ensure_server(Settings.from_env(data_dir=data, redis_url=None))
    try:
        assert url != foreign.url
        assert embedded.recorded_url(data) == url
    finally:
        assert embedded.stop(data)


def test_durable_redis_on_a_taken_port_fails_in_the_foreground(
    tmp_path: Path, make_server: ServerFactory, user_env: dict[str, str]
) -> None:
    taken = make_server(fsync="everysec")
    out = _durable(["redis", "--port", str(taken.port)], tmp_path, user_env, timeout=30)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {taken.port}" in lines[0] and "taken" in lines[0]
    assert not (tmp_path / "state" / "durable" / embedded.ADDRESS_FILE).exists()


def test_a_server_started_on_a_port_another_server_took_is_an_error_not_that_server(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    """Window: between ``free_port`` choosing a port and the new server binding it, another
    server takes the port. The new one exits, unable to bind; starting it is an error and
    nothing is recorded. (It waited for any answer on the port: the foreign server's answer
    made it record that server's address as its own, with its own process id.)"""
    taken = make_server(fsync="everysec")
    data = tmp_path / "data"
    with pytest.raises(RuntimeError, match="redis-server exited"):
        embedded.start(data, "everysec", port=taken.port)
    assert not (data / embedded.ADDRESS_FILE).exists()
    assert embedded.recorded_url(data) is None
