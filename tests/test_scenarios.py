"""The six scenarios of the examples, against real processes: the session's Redis, a world
process in its non-deduplicating mode, worker processes and the reconciler.

Each scenario checks the applications per key in the world, the final state and
``verify``; ``Outcome.assert_ok`` raises with every failed check.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from durable.testing import Server
from examples.scenarios import Stack, run_one
from examples.scenarios.outcome import Check, Outcome
from examples.scenarios.runner import main


@pytest.fixture(scope="module")
def stack(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack.up(server.url, workdir=tmp_path_factory.mktemp("scenarios")) as s:
        yield s


def test_normal_completion(stack: Stack) -> None:
    """No fault: one read, one row, one notification, no unknown outcome."""
    out = run_one(stack, "normal")
    out.assert_ok()
    assert out.state == "completed"


def test_crash_between_effect_and_outcome(stack: Stack) -> None:
    """Window after_effect:3: the row is written, the worker is SIGKILLed before recording
    the outcome; recovery finds it by lookup and never writes it again."""
    out = run_one(stack, "crash")
    out.assert_ok()
    assert out.figures["recovered in ms"] > 0


def test_timeout_resolved_by_lookup(stack: Stack) -> None:
    """Window: notify applied, its reply held past the tool's timeout (outcome unknown);
    resolved by lookup after the deadline, never sent twice."""
    run_one(stack, "timeout").assert_ok()


def test_cancel_while_a_tool_runs(stack: Stack) -> None:
    """Window: the notify request is held by the API when the cancel is requested; the
    tool aborts the attempt, the run ends canceled, nothing is applied after the request."""
    out = run_one(stack, "cancel")
    out.assert_ok()
    assert out.state == "canceled"


def test_replay_after_recovery(stack: Stack) -> None:
    """Window after_intent:4: intent recorded, nothing sent, worker SIGKILLed; after recovery
    the log replays to the same state from any offset and re-driving applies nothing."""
    run_one(stack, "replay").assert_ok()


def test_approval_wait_then_one_effect(stack: Stack) -> None:
    """``publish`` requires the role comms: the run waits holding no lease and no worker,
    nothing sent; a wrong role, an unregistered key, a key written into the registry without
    the admin's signature and a signature by another key are refused and write nothing;
    once alice's signed approval is recorded, the worker takes the run again and the
    notification is applied once, after the decision."""
    out = run_one(stack, "approval")
    out.assert_ok()
    assert out.state == "completed"
    assert [(d["approver"], d["events written"]) for d in out.decisions] == [
        ("bob", 0), ("mallory", 0), ("eve", 0), ("alice (signed with mallory's key)", 0),
        ("alice", 2)]
    assert [a["decision"] for a in out.approvals] == ["approve"]


def test_a_failed_check_fails_loudly() -> None:
    out = Outcome("x", "title", "window", run_id="r1")
    out.expect("database applications per key", {"r1:3": 1}, {"r1:3": 2})
    assert not out.ok
    with pytest.raises(AssertionError, match=r"database applications per key: expected"):
        out.assert_ok()
    assert Check("c", 1, 1).ok
    assert not Outcome("y", "t", "w").ok  # no checks ran: not a pass


def test_unknown_scenario_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["nope"])
    assert exc.value.code == 2


def test_a_scenario_runs_on_its_own_as_a_module() -> None:
    """``python -m examples.scenarios.normal``: its own Redis and world; exit 0 on a pass."""
    proc = subprocess.run([sys.executable, "-m", "examples.scenarios.normal"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout


def test_demo_json_on_one_scenario() -> None:
    proc = subprocess.run([sys.executable, "-m", "examples", "demo", "--only", "normal",
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and [s["scenario"] for s in report["scenarios"]] == ["normal"]
    assert report["scenarios"][0]["applications"]["api"]
