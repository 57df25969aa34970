"""The ``durable`` command line: every subcommand, tables and --json, and the error paths
(exit 0 ok, 1 check failed or not found, 2 usage error)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis

from durable.cli import main
from durable.client import Client
from durable.log import keys
from durable.testing import Server, env_for
from tests.conftest import WorkerFactory


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_start_prints_the_run_id_alone(server: Server, client: Client) -> None:
    out = subprocess.run([sys.executable, "-m", "durable", "start", "count", "--input",
                          '{"steps": 1}', "--run-id", "cli-1"], env=env_for(server.url),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "cli-1\n"


def test_status_runs_log_replay_verify_export_on_a_finished_run(
    capsys: pytest.CaptureFixture[str], client: Client, worker: WorkerFactory
) -> None:
    assert _run(capsys, "start", "count", "--input", '{"steps": 2}', "--run-id", "cli-2")[0] == 0
    worker()
    assert client.wait("cli-2", 20).state == "completed"
    code, out, _ = _run(capsys, "status", "cli-2", "--json")
    assert code == 0 and json.loads(out)["state"] == "completed"
    code, out, _ = _run(capsys, "status", "cli-2")
    assert code == 0 and "completed" in out
    code, out, _ = _run(capsys, "runs", "--state", "completed", "--json")
    assert [json.loads(line)["run_id"] for line in out.splitlines()] == ["cli-2"]
    assert "cli-2" in _run(capsys, "runs")[1]
    code, out, _ = _run(capsys, "log", "cli-2", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and lines[0]["type"] == "run_started" and all("id" in x for x in lines)
    middle = lines[3]["id"]
    code, out, _ = _run(capsys, "log", "cli-2", "--from", middle, "--to", middle, "--json")
    assert [json.loads(x)["id"] for x in out.splitlines()] == [middle]
    assert "step_decided" in _run(capsys, "log", "cli-2")[1]
    code, out, _ = _run(capsys, "replay", "cli-2", "--from", middle, "--json")
    body = json.loads(out)
    assert code == 0 and body["summary"]["state"] == "completed"
    assert body["trajectory"][0]["id"] == middle
    assert "trajectory" in _run(capsys, "replay", "cli-2", "--to", middle)[1]
    code, out, _ = _run(capsys, "verify", "cli-2", "--json")
    assert code == 0 and json.loads(out)["ok"] is True
    assert _run(capsys, "verify", "cli-2")[0] == 0
    code, out, _ = _run(capsys, "export", "cli-2")
    kinds = [json.loads(x)["kind"] for x in out.splitlines()]
    assert code == 0 and kinds.count("effect") == 2 and kinds[-1] == "summary"


def test_verify_fails_with_exit_1_when_the_projection_lies(
    capsys: pytest.CaptureFixture[str], client: Client, r: redis.Redis
) -> None:
    client.start("count", {"steps": 1}, run_id="liar", enqueue=False)
    r.hset(client.log.keys.run("liar"), "state", "completed")
    code, out, _ = _run(capsys, "verify", "liar", "--json")
    assert code == 1 and json.loads(out)["checks"]["projection"] != "ok"


def test_cancel_and_reconcile_and_fork(capsys: pytest.CaptureFixture[str],
                                       client: Client) -> None:
    client.start("count", {"steps": 1}, run_id="cli-c", enqueue=False)
    code, out, _ = _run(capsys, "cancel", "cli-c", "--reason", "test", "--json")
    assert code == 0 and json.loads(out)["state"] == "canceled"
    # Again: the run is terminal, and the cancel says so (exit 1, nothing written).
    assert _run(capsys, "cancel", "cli-c")[::2] == (
        1, "durable: run cli-c is already canceled; nothing to cancel\n")
    assert _run(capsys, "reconcile", "cli-c")[0] == 0
    first = client.events("cli-c")[0].id
    code, out, _ = _run(capsys, "fork", "cli-c", "--at", first, "--new-run-id", "cli-f")
    assert code == 0 and out.strip() == "cli-f"
    assert client.status("cli-f").parent == "cli-c"


@pytest.mark.parametrize("argv", [
    ["status", "nope"], ["log", "nope"], ["verify", "nope"], ["replay", "nope"],
    ["cancel", "nope"], ["export", "nope"], ["reconcile", "nope"],
])
def test_an_unknown_run_exits_1(argv: list[str], capsys: pytest.CaptureFixture[str],
                                client: Client) -> None:
    code, _, err = _run(capsys, *argv)
    assert code == 1 and "nope" in err


@pytest.mark.parametrize("argv,message", [
    (["start", "no-such-agent"], "unknown agent 'no-such-agent'"),
    (["start", "count", "--input", "{not json"], "not valid JSON"),
    (["start", "count", "--input", '{"steps": -1}'], "invalid input for agent 'count'"),
    (["start", "count", "--run-id", "bad id!"], "invalid run id"),
    (["cancel", "x", "--scope", "everything"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
])
def test_usage_errors_exit_2_with_one_line(argv: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str],
                                           client: Client) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert message in err
    assert out == ""
    assert not client.redis.keys("dx:{*}:log")


def test_repair_index_rebuilds_the_derived_indexes_from_the_logs(
    capsys: pytest.CaptureFixture[str], client: Client, r: redis.Redis
) -> None:
    client.start("count", {"steps": 1}, run_id="ix1", enqueue=False)
    client.start("count", {"steps": 1}, run_id="ix2", enqueue=False)
    client.cancel("ix2", "stop")
    for key in [*r.keys("dx:runs*"), keys.DUE.encode()]:
        r.delete(key)
    assert client.runs() == []
    code, out, _ = _run(capsys, "repair-index")
    assert code == 0 and "reindexed 2 runs" in out
    assert {s.run_id: s.state for s in client.runs()} == {"ix1": "pending", "ix2": "canceled"}
    assert [s.run_id for s in client.runs("canceled")] == ["ix2"]
    assert r.zscore(keys.DUE, "ix1") is not None and r.zscore(keys.DUE, "ix2") is None


def test_quarantine_release_command(capsys: pytest.CaptureFixture[str], client: Client,
                                    r: redis.Redis) -> None:
    from durable.log.events import Quarantined
    from durable.log.store import Spec

    client.start("count", {"steps": 1}, run_id="qr", enqueue=False)
    handle = client.log.load("qr")
    client.log.commit(handle, [Spec(Quarantined, {"reason": "operator check"})])
    code, out, _ = _run(capsys, "runs", "--state", "quarantined", "--json")
    assert json.loads(out)["reason"] == "operator check"
    code, out, _ = _run(capsys, "quarantine", "release", "qr")
    assert code == 0 and "pending" in out
    assert client.status("qr").state == "pending"


def test_redis_stop_shuts_the_recorded_background_server(
    capsys: pytest.CaptureFixture[str], tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    from durable.backend import embedded

    data = Path(str(tmp_path))
    _url, proc = embedded.start(data, "everysec")
    monkeypatch.setenv("DURABLE_DATA_DIR", str(data))
    code, out, _ = _run(capsys, "redis", "--stop")
    assert code == 0 and "stopped" in out
    assert proc.wait(10) is not None
    assert _run(capsys, "redis", "--stop")[0] == 1
