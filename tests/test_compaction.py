"""Context compaction that replays exactly (``durable.compaction``): a 100-call conversation
of a code agent against the local model server (real HTTP, each request kept), driven by
real worker processes. Its requests stay under the bound while the log keeps every message;
a summary is a step taken once (a worker SIGKILLed right after it is recorded: the next
worker sends no second summarizer request); the saved run replays offline."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import tests.agents.compacted  # noqa: F401  (the client plans with the agents)
from durable.cli import main
from durable.client import Client
from durable.compaction import SUMMARY_HEAD, SUMMARY_PROMPT
from durable.log import events as ev
from durable.testing import replay_file, wait_for
from tests.conftest import ModelFactory, WorkerFactory
from tests.runs import events_of
from tests.servers.model import ModelServer, Seen

AGENTS = "examples.agents,tests.agents.basic,tests.agents.compacted"
BOUND = 400


@pytest.fixture()
def model(serve_model: ModelFactory) -> ModelServer:
    return serve_model(AGENTS, tokens=5)


def _requests(model: ModelServer, run: str) -> list[Seen]:
    return [s for s in model.seen if s.key.startswith(f"{run}:")]


def _summarizing(seen: Seen) -> bool:
    return bool(seen.body["messages"][0]["content"] == SUMMARY_PROMPT)


def test_a_compacted_100_call_conversation_stays_under_its_bound_and_keeps_every_message(
        client: Client, worker: WorkerFactory, model: ModelServer, tmp_path: Path) -> None:
    run = client.start("compacted_looper", {"calls": 100, "max_tokens": BOUND},
                       run_id="compact").run_id
    worker(burst=True).wait(120)
    final = client.wait(run, 60)
    assert final.state == "completed", (final.state, final.reason)
    sent = _requests(model, run)
    talks = [s for s in sent if not _summarizing(s)]
    summaries = [s for s in sent if _summarizing(s)]
    assert len(talks) == 100 and len(summaries) == final.result["summaries"] >= 5
    # Every request of the conversation is under the bound, while the conversation grew to
    # 202 messages (about 3,500 tokens).
    sizes = [len(json.dumps(s.body["messages"], separators=(",", ":"))) // 4 for s in talks]
    assert max(sizes) <= BOUND, sizes
    assert final.result["messages"] == 2 + 2 * 100
    # The log keeps every message: each reply and each tool result is a step's outcome, the
    # summaries are steps of their own, counted by the budgets.
    events = events_of(client, run)
    outcomes = Counter(e.tool for e in events if isinstance(e, ev.StepDecided))
    assert outcomes == {"chat": 100 + len(summaries), "noop": 100}
    assert final.model_calls == 100 + len(summaries)
    assert len([e for e in events if isinstance(e, ev.ActionSucceeded)]) == 200 + len(summaries)
    assert Counter(s.key for s in sent).most_common(1)[0][1] == 1  # each request once

    path = tmp_path / "compact.jsonl.gz"
    assert main(["export", run, "--saved", "-o", str(path)]) == 0
    seen = len(model.seen)
    assert replay_file(path).steps == 200 + len(summaries)  # the summaries replay too
    assert len(model.seen) == seen


def test_a_worker_killed_right_after_a_summary_is_recorded_sends_no_second_one(
        client: Client, worker: WorkerFactory, model: ModelServer) -> None:
    """Crash window: SIGKILLed right after the first summary's outcome is recorded (the
    step after it not taken). The next worker executes the function again from the log:
    the summary comes back from it, the same windows are rebuilt (their digests match the
    recorded ones) and the summarizer is not asked again."""
    probe = client.start("compacted_looper", {"calls": 30, "max_tokens": BOUND},
                         run_id="probe").run_id
    worker(burst=True).wait(120)
    assert client.wait(probe, 60).state == "completed"
    first = next(int(s.key.split(":")[-1]) for s in _requests(model, probe) if _summarizing(s))

    run = client.start("compacted_looper", {"calls": 30, "max_tokens": BOUND},
                       run_id="killed").run_id
    assert worker(kill_at=f"after_outcome:{first}").wait(120) == -9
    assert [s for s in _requests(model, run) if _summarizing(s)][-1].key == f"{run}:{first}"
    assert wait_for(lambda: client.redis.get(client.log.keys.lease(run)) is None, 10)
    client.enqueue(run, force=True)
    worker(burst=True).wait(120)
    final = client.wait(run, 60)
    assert final.state == "completed", (final.state, final.reason)
    keys = Counter(s.key for s in _requests(model, run))
    assert keys[f"{run}:{first}"] == 1 and max(keys.values()) == 1
    assert final.result == client.status(probe).result


def test_a_function_summarizer_is_recorded_as_a_value_and_asks_no_model(
        client: Client, worker: WorkerFactory, model: ModelServer) -> None:
    """``summarize=fn``: the summaries are values recorded with the next step, so a
    re-execution gets them back; no summarizer request is made."""
    run = client.start("compacted_looper", {"calls": 60, "max_tokens": BOUND,
                                            "summarize_fn": True}, run_id="counted").run_id
    worker(burst=True).wait(120)
    final = client.wait(run, 60)
    assert final.state == "completed" and final.result["summaries"] >= 2
    assert not [s for s in _requests(model, run) if _summarizing(s)]
    assert len(_requests(model, run)) == 60
    drawn = [v for e in events_of(client, run) if isinstance(e, ev.StepDecided)
             for v in e.values if v[0] == "summary"]
    assert len(drawn) == final.result["summaries"]
    assert " messages, the last: " in drawn[0][1]


def test_a_session_goes_on_from_the_summary_of_its_previous_turn(
        client: Client, worker: WorkerFactory, model: ModelServer) -> None:
    """Three turns of a session, 20 calls each: every request of every turn is under the
    bound; the conversation saved by the last turn has every message of the three; a
    later turn's first summary starts from the previous turn's summary, not from the
    whole history."""
    runs: list[str] = []
    for turn in range(3):
        runs.append(client.start("compacted_talker", {"calls": 20, "max_tokens": BOUND},
                                 run_id=f"talk{turn}",
                                 continue_from=runs[-1] if runs else None).run_id)
        worker(burst=True).wait(120)
        final = client.wait(runs[-1], 60)
        assert final.state == "completed", (final.state, final.reason)
    assert final.result["messages"] == 1 + 3 * (1 + 2 * 20)
    for run in runs:
        talks = [s for s in _requests(model, run) if not _summarizing(s)]
        assert len(talks) == 20
        assert max(len(json.dumps(s.body["messages"], separators=(",", ":"))) // 4
                   for s in talks) <= BOUND
    for run in runs[1:]:
        summaries = [s for s in _requests(model, run) if _summarizing(s)]
        assert summaries, run
        assert summaries[0].body["messages"][1]["content"].startswith(
            "system: " + SUMMARY_HEAD), summaries[0].body["messages"][1]["content"][:200]
