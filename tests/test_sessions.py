"""Sessions: a run continues an earlier run's conversation by reference
(``start(..., continue_from=RUN)``, ``durable.conversations``), with no cap from the input
limit. Real worker processes, the local model server (``tests.servers.model``) seeing the
whole conversation at each turn. The first test is marked ``cluster`` (``pytest
--cluster`` runs it on a real 3-master cluster: the two runs' keys are on different
shards)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from durable import conversations
from durable.audit.verify import verify
from durable.cli.main import main
from durable.client import Client
from durable.errors import UsageError
from durable.log import events as ev
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.runs import events_of
from tests.servers.model import ModelServer, expected_text

AGENTS = "examples.agents,tests.agents.basic,tests.agents.model_steps"
PAD = 400_000  # characters of filler per user turn


@pytest.fixture()
def model(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[ModelServer]:
    srv = ModelServer(tokens=20).start()
    monkeypatch.setenv("DURABLE_MODEL_BASE_URL", srv.url)
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    yield srv
    srv.stop()


@pytest.mark.cluster
def test_a_session_continued_three_times_past_1_mb_of_history(
        client: Client, worker: WorkerFactory, model: ModelServer) -> None:
    client.registry.load(AGENTS)
    worker()
    runs, before = [], None
    for turn in range(1, 5):
        run = client.start("talker", {"say": f"turn {turn}", "pad": PAD},
                           run_id=f"talk-{turn}", continue_from=before).run_id
        final = client.wait(run, timeout=60, waiting=False)
        assert final.state == "completed", (final.state, final.error)
        assert final.result["turns"] == turn
        runs.append(run)
        before = run
    assert final.result["bytes"] > 1_000_000 * 1.5
    last = model.seen[-1].body["messages"]  # the model saw the whole conversation
    assert [m["role"] for m in last] == ["user", "assistant"] * 3 + ["user"]
    assert [m["content"][:6] for m in last if m["role"] == "user"] == [
        f"turn {n}" for n in range(1, 5)]
    assert all(m["content"] == expected_text(20) for m in last if m["role"] == "assistant")
    events = events_of(client, runs[-1])
    started = events[0]
    assert isinstance(started, ev.RunStarted) and started.continue_from == runs[-2]
    assert len(str(started.input)) < 200  # by reference: nothing of it in the input
    loaded = [e for e in events if isinstance(e, ev.ActionSucceeded) and e.step == 1]
    assert loaded[0].blob is not None and loaded[0].blob.size > 1_000_000  # beside the run
    answer = {"role": "assistant", "content": expected_text(20)}
    assert conversations.kept(client, runs[-1]) == [*last, answer]
    for run in runs:
        assert verify(client.log, run).ok


def test_only_a_completed_run_can_be_continued(client: Client, model: ModelServer,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    client.registry.load(AGENTS)
    client.start("talker", {"say": "hi"}, run_id="not-yet")
    with pytest.raises(UsageError, match="is pending, not completed"):
        client.start("talker", {"say": "more"}, run_id="too-soon", continue_from="not-yet")
    with pytest.raises(UsageError, match="no run 'nobody'"):
        client.start("talker", {"say": "more"}, run_id="too-soon", continue_from="nobody")
    assert client.log.projection("too-soon") == {}  # nothing was written
    code = main(["start", "talker", "--input", '{"say": "more"}', "--continue-from",
                 "not-yet"])
    assert code == 2 and "not completed" in capsys.readouterr().err


def test_a_continued_run_killed_mid_turn_reads_its_history_from_its_own_log(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        model: ModelServer) -> None:
    """SIGKILL after the model answered step 2 (the chat), before its outcome was recorded:
    re-execution takes the loaded history (step 1) from the run's log, the model request is
    sent again once, and the conversation is saved once."""
    client.registry.load(AGENTS)
    first = client.start("talker", {"say": "turn 1", "pad": PAD}, run_id="kill-1").run_id
    worker(burst=True).wait(60)
    assert client.status(first).state == "completed"
    run = client.start("talker", {"say": "turn 2"}, run_id="kill-2",
                       continue_from=first).run_id
    assert worker(kill_at="after_effect:2").wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60, waiting=False)
    assert final.state == "completed" and final.result["turns"] == 2
    dispatched = [e.step for e in events_of(client, run) if isinstance(e, ev.ActionDispatched)]
    assert dispatched == [1, 2, 2, 3]  # the load once, the chat in flight twice, the save
    assert len(model.requests(f"{run}:2")) == 2
    assert verify(client.log, run).ok
