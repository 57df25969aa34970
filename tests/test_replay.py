"""Replay from any offset, recorded logs as fixtures, re-driving, forks and nondeterminism."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from durable.agents import registry
from durable.audit.replay import check_determinism, fork, import_log, replay, state_at
from durable.audit.verify import verify
from durable.client import Client
from durable.errors import NondeterminismError
from durable.log import events as ev
from durable.log.fold import apply
from durable.log.state import RunState
from durable.log.store import Spec
from tests.conftest import WorkerFactory

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*.jsonl"))


def _load_fixture(path: Path) -> list[dict[str, object]]:
    return [msgspec.json.decode(line) for line in path.read_bytes().splitlines() if line]


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_recorded_logs_replay_verify_and_re_decide_identically(path: Path, client: Client) -> None:
    events = _load_fixture(path)
    run = f"fixture-{path.stem}"
    import_log(client.log, run, events)
    report = verify(client.log, run)
    assert report.ok, report.checks
    state = client.status(run)
    assert state.state == events[-1]["type"] or state.terminal
    assert check_determinism(client.log, run, registry.agent(state.agent)) == state.step


def test_replay_from_every_offset_equals_the_incremental_fold(client: Client,
                                                              worker: WorkerFactory) -> None:
    client.settings.log.checkpoint_every = 10
    client.log.checkpoint_every = 10
    run = client.start("count", {"steps": 12}, run_id="every", enqueue=False).run_id
    worker(DURABLE_CHECKPOINT_EVERY="10")
    client.enqueue(run)
    assert client.wait(run, 20).state == "completed"
    entries = client.events(run)
    assert any(isinstance(e.event, ev.Checkpoint) for e in entries)
    incremental = RunState()
    for entry in entries:
        assert entry.event is not None
        apply(incremental, entry.event)
        at, _ckpt = state_at(client.log, run, entry.id)
        assert at == incremental, entry.id
    middle = entries[len(entries) // 2].id
    result = replay(client.log, run, "-", middle)
    assert result.state.version == entries[len(entries) // 2].event.seq  # type: ignore[union-attr]


def test_re_driving_a_completed_run_performs_no_effect(client: Client, worker: WorkerFactory,
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.agents.basic import applications

    monkeypatch.setenv("TEST_DB", str(tmp_path / "w.sqlite"))
    run = client.start("writer", {"steps": 2}, run_id="redrive").run_id
    w = worker()
    assert client.wait(run, 20).state == "completed"
    before = client.events(run)
    client.enqueue(run, force=True)
    client.enqueue(run, force=True)
    assert worker(burst=True).wait(30) == 0  # returns once the queue is empty
    w.stop()
    assert len(client.events(run)) == len(before)
    assert applications(str(tmp_path / "w.sqlite")) == {f"{run}:1": 1, f"{run}:2": 1}


def test_fork_then_finish_leaves_the_original_untouched(client: Client,
                                                       worker: WorkerFactory) -> None:
    run = client.start("count", {"steps": 4}, run_id="orig").run_id
    worker()
    assert client.wait(run, 20).state == "completed"
    entries = client.events(run)
    at = next(e.id for e in entries
              if isinstance(e.event, ev.ActionSucceeded) and e.event.step == 2)
    original = [e.id for e in entries]
    fork(client.log, run, at, "orig-fork")
    client.enqueue("orig-fork")
    forked = client.wait("orig-fork", 20)
    assert forked.state == "completed" and forked.parent == run
    assert [e.id for e in client.events(run)] == original
    keys = [e.event.key for e in client.events("orig-fork")
            if isinstance(e.event, ev.ActionDispatched)]
    assert keys == [f"{run}:1", f"{run}:2", "orig-fork:3", "orig-fork:4"]  # inherited, new
    assert verify(client.log, "orig-fork").ok


def test_changed_agent_code_on_an_old_log_is_a_nondeterminism_error(
    client: Client, worker: WorkerFactory
) -> None:
    """The log records an intent the current code would not take: the worker re-driving it
    quarantines the run with a clear error instead of diverging."""
    run = client.start("count", {"steps": 2}, run_id="old", enqueue=False).run_id
    handle = client.log.load(run, actor="old-code")
    client.log.commit(handle, [Spec(ev.StepDecided, {"step": 1, "tool": "noop",
                                                     "args": {"n": 41, "sleep_s": 0.0},
                                                     "key": f"{run}:1"})])
    with pytest.raises(NondeterminismError, match="step 1"):
        check_determinism(client.log, run, registry.agent("count"))
    worker()
    client.enqueue(run)
    final = client.wait(run, 20)
    assert final.state == "quarantined"
    assert "step 1" in (final.reason or "") and "n\":41" in (final.reason or "")
