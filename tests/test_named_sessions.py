"""Named sessions (``start(..., session=NAME)``, ``durable.controls.sessions``): each start
continues the session's latest run by reference, one turn at a time, per tenant. Real worker
processes and real SIGKILLs; the model servers are local HTTP servers that see the whole
conversation of each turn (``tests.servers.model`` for a code agent, ``tests.servers.openai``
for pydantic-ai and the OpenAI Agents SDK, ``tests.agents.sessions``). The tests marked
``cluster`` run on a real 3-master cluster with ``pytest --cluster``: a session's keys and
its runs' keys are on different shards."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from durable import conversations
from durable.audit.verify import verify
from durable.cli.main import main
from durable.client import Client
from durable.controls import sessions
from durable.errors import RunIdConflict, SessionBusy, UsageError
from durable.log import events as ev
from durable.log import keys
from durable.log.store import now_ms
from durable.settings import Settings
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.servers.model import ModelServer, expected_text
from tests.servers.openai import OpenAIServer

AGENTS = "examples.agents,tests.agents.basic,tests.agents.model_steps,tests.agents.sessions"
PAD = 400_000  # characters of filler per user turn of the code agent


@pytest.fixture()
def model(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Iterator[ModelServer]:
    srv = ModelServer(tokens=20).start()
    monkeypatch.setenv("DURABLE_MODEL_BASE_URL", srv.url)
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    yield srv
    srv.stop()


@pytest.fixture()
def openai_server(monkeypatch: pytest.MonkeyPatch, settings: Settings
                  ) -> Iterator[OpenAIServer]:
    srv = OpenAIServer().start()
    monkeypatch.setenv("TEST_OPENAI_URL", srv.url)
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    yield srv
    srv.stop()


def _events(client: Client, run: str) -> list[ev.Event]:
    return [e.event for e in client.events(run) if e.event is not None]


def _started(client: Client, run: str) -> ev.RunStarted:
    first = _events(client, run)[0]
    assert isinstance(first, ev.RunStarted)
    return first


def _turns(client: Client, agent: str, inputs: list[Any], session: str, *, prefix: str,
           tenant: str | None = None) -> list[str]:
    runs = []
    for n, data in enumerate(inputs, 1):
        run = client.start(agent, data, run_id=f"{prefix}-{n}", session=session,
                           tenant=tenant).run_id
        final = client.wait(run, timeout=90, waiting=False)
        assert final.state == "completed", (final.state, final.error)
        runs.append(run)
    return runs


@pytest.mark.cluster
def test_a_code_agents_session_continued_three_times_past_1_mb(
        client: Client, worker: WorkerFactory, model: ModelServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    client.registry.load(AGENTS)
    worker()
    runs = _turns(client, "talker", [{"say": f"turn {n}", "pad": PAD} for n in range(1, 5)],
                  "chat-42", prefix="talk", tenant="acme")
    final = client.status(runs[-1])
    assert final.result == {"turns": 4, "bytes": final.result["bytes"]}
    assert final.result["bytes"] > 1_500_000
    last = model.seen[-1].body["messages"]  # the model saw the whole conversation
    assert [m["content"][:6] for m in last if m["role"] == "user"] == [
        f"turn {n}" for n in range(1, 5)]
    assert all(m["content"] == expected_text(20) for m in last if m["role"] == "assistant")
    for before, run in zip(["", *runs], runs, strict=False):
        started = _started(client, run)
        assert (started.session, started.tenant, started.continue_from) == (
            "chat-42", "acme", before)
        assert len(msgspec.json.encode(started.input)) < 200  # by reference
        assert verify(client.log, run).ok
    listed = client.runs(session="chat-42", tenant="acme")
    assert [r.run_id for r in listed] == runs[::-1]  # the latest turn first
    assert main(["runs", "--session", "chat-42", "--tenant", "acme", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["run_id"] for row in rows] == runs[::-1]
    # The same name under another tenant is another session: it starts afresh.
    other = client.start("talker", {"say": "hello"}, run_id="talk-other", session="chat-42",
                         tenant="globex").run_id
    done = client.wait(other, timeout=60, waiting=False)
    assert done.state == "completed" and done.result["turns"] == 1
    assert _started(client, other).continue_from == ""
    assert [r.run_id for r in client.runs(session="chat-42", tenant="globex")] == [other]


def test_a_pydantic_ai_session_continued_three_times_past_1_mb(
        client: Client, worker: WorkerFactory, openai_server: OpenAIServer) -> None:
    client.registry.load(AGENTS)
    worker()
    runs = _turns(client, "pai_reader", [{"prompt": f"turn {n}"} for n in range(1, 5)],
                  "pai-7", prefix="pai")
    final = client.status(runs[-1])
    assert final.result.startswith("read 4 pages in 4 turns")
    body = openai_server.requests[-1]["body"]["messages"]  # the last request of turn 4
    assert [m["content"] for m in body if m["role"] == "user"] == [
        f"turn {n}" for n in range(1, 5)]
    assert [m["role"] for m in body].count("tool") == 4
    assert [m["role"] for m in body].count("assistant") == 7  # 3 answers, 4 calls
    kept = conversations.kept(client, runs[-1])
    assert kept is not None and len(msgspec.json.encode(kept)) > 1_000_000
    loaded = [e for e in _events(client, runs[-1]) if isinstance(e, ev.ActionSucceeded)
              and e.step == 1]
    assert loaded[0].blob is not None and loaded[0].blob.size > 1_000_000  # beside the run
    for before, run in zip(["", *runs], runs, strict=False):
        assert _started(client, run).continue_from == before
        assert verify(client.log, run).ok
    first = [e.tool for e in _events(client, runs[0]) if isinstance(e, ev.StepDecided)]
    assert first == ["pai_reader.model", "pai_reader.tool.read_page", "pai_reader.model",
                     conversations.SAVE]  # the first turn has nothing to load


def test_an_openai_agents_sdk_session_continued_three_times_past_1_mb(
        client: Client, worker: WorkerFactory, openai_server: OpenAIServer) -> None:
    client.registry.load(AGENTS)
    worker()
    runs = _turns(client, "oai_reader", [{"input": f"turn {n}"} for n in range(1, 5)],
                  "oai-7", prefix="oai")
    assert client.status(runs[-1]).result.startswith("read 4 pages in 4 turns")
    body = openai_server.requests[-1]["body"]["messages"]
    assert [m["content"] for m in body if m["role"] == "user"] == [
        f"turn {n}" for n in range(1, 5)]
    assert [m["role"] for m in body].count("tool") == 4
    kept = conversations.kept(client, runs[-1])
    assert kept is not None and len(msgspec.json.encode(kept)) > 1_000_000
    steps = [e.tool for e in _events(client, runs[-1]) if isinstance(e, ev.StepDecided)]
    assert steps == [conversations.LOAD, "oai_reader.model", "oai_reader.tool.read_page",
                     "oai_reader.model", conversations.SAVE]
    for run in runs:
        assert verify(client.log, run).ok


@pytest.mark.cluster
def test_two_concurrent_starts_of_one_session_one_wins_the_other_is_refused(
        client: Client, settings: Settings, model: ModelServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Two producers start a turn of the same session at the same instant, 20 times over:
    each time exactly one run is started and the other start is refused with
    ``SessionBusy``, writing nothing."""
    client.registry.load(AGENTS)
    producers = [Client(settings), Client(settings)]
    for p in producers:
        p.registry.load(AGENTS)
    for n in range(20):
        gate = threading.Barrier(2)
        outcome: dict[str, Any] = {}

        def start(who: int, n: int = n, gate: threading.Barrier = gate,
                  outcome: dict[str, Any] = outcome) -> None:
            gate.wait()
            try:
                outcome[f"r{n}-{who}"] = producers[who].start(
                    "talker", {"say": "hi"}, run_id=f"r{n}-{who}", session=f"race-{n}")
            except SessionBusy as exc:
                outcome[f"r{n}-{who}"] = exc

        threads = [threading.Thread(target=start, args=(who,)) for who in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        won = [run for run, got in outcome.items() if not isinstance(got, SessionBusy)]
        lost = [run for run, got in outcome.items() if isinstance(got, SessionBusy)]
        assert len(won) == 1 and len(lost) == 1, outcome
        assert outcome[lost[0]].run_id == won[0]  # told which run holds the session
        assert client.log.projection(lost[0]) == {}  # nothing written for the loser
        assert [r.run_id for r in client.runs(session=f"race-{n}")] == won
    # A turn while the latest run is still pending is refused too, from the CLI as well.
    with pytest.raises(SessionBusy, match=r"'r0-.' is pending"):
        client.start("talker", {"say": "again"}, session="race-0")
    capsys.readouterr()
    assert main(["start", "talker", "--input", '{"say": "again"}', "--session",
                 "race-0"]) == 2
    assert "has a run in progress" in capsys.readouterr().err
    # The same start again is the idempotent no-op it always is, session or not.
    winner = client.runs(session="race-0")[0].run_id
    again = client.start("talker", {"say": "hi"}, run_id=winner, session="race-0")
    assert not again.created
    with pytest.raises(RunIdConflict, match="session"):
        client.start("talker", {"say": "hi"}, run_id=winner, session="race-1")
    with pytest.raises(UsageError, match="not both"):
        client.start("talker", {"say": "hi"}, session="race-0", continue_from=winner)


def test_a_session_run_killed_mid_save_loses_no_message(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        model: ModelServer) -> None:
    """SIGKILL after turn 2's ``conversation.save`` (step 3) ran, before its outcome was
    recorded: re-execution takes the load and the chat from the log (the model is not asked
    again), saves once more, and turn 3 sees every message of turns 1 and 2."""
    client.registry.load(AGENTS)
    first = client.start("talker", {"say": "turn 1", "pad": PAD}, run_id="ks-1",
                         session="kill").run_id
    worker(burst=True).wait(60)
    assert client.status(first).state == "completed"
    second = client.start("talker", {"say": "turn 2"}, run_id="ks-2", session="kill").run_id
    assert worker(kill_at="after_effect:3").wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    assert client.wait(second, timeout=60, waiting=False).state == "completed"
    dispatched = [e.step for e in _events(client, second) if isinstance(e, ev.ActionDispatched)]
    assert dispatched == [1, 2, 3, 3]  # the save in flight twice, nothing else again
    assert len(model.requests(f"{second}:2")) == 1
    third = client.start("talker", {"say": "turn 3"}, run_id="ks-3", session="kill").run_id
    done = client.wait(third, timeout=60, waiting=False)
    assert done.state == "completed" and done.result["turns"] == 3
    sent = model.requests(f"{third}:2")[-1].body["messages"]
    assert [(m["role"], m["content"][:6]) for m in sent] == [
        ("user", "turn 1"), ("assistant", expected_text(20)[:6]), ("user", "turn 2"),
        ("assistant", expected_text(20)[:6]), ("user", "turn 3")]
    assert verify(client.log, second).ok


@pytest.mark.parametrize(("agent", "field"), [("pai_reader", "prompt"),
                                            ("oai_reader", "input")])
def test_a_framework_session_run_killed_mid_save_loses_no_message(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch, agent: str,
        field: str) -> None:
    """SIGKILL after turn 2's ``conversation.save`` (step 5: load, model, read_page, model,
    save) ran, before its outcome was recorded: the function executed again builds the same
    messages (pydantic-ai's requests' timestamps are left out of what is saved), so the save
    is the same step, not a nondeterminism; no model request is sent again, and turn 3 sees
    both earlier turns."""
    monkeypatch.setenv("TEST_PAGE_CHARS", "1000")
    client.registry.load(AGENTS)
    first = client.start(agent, {field: "turn 1"}, run_id=f"{agent}-k1",
                         session="kill").run_id
    worker(burst=True).wait(60)
    assert client.status(first).state == "completed"
    second = client.start(agent, {field: "turn 2"}, run_id=f"{agent}-k2",
                          session="kill").run_id
    assert worker(kill_at="after_effect:5").wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(second, timeout=60, waiting=False)
    assert final.state == "completed", (final.state, final.error)
    assert openai_server.counts(second) == {f"{second}:2": 1, f"{second}:4": 1}
    dispatched = [e.step for e in _events(client, second) if isinstance(e, ev.ActionDispatched)]
    assert dispatched == [1, 2, 3, 4, 5, 5]  # the save in flight twice, nothing else again
    third = client.start(agent, {field: "turn 3"}, run_id=f"{agent}-k3",
                         session="kill").run_id
    assert client.wait(third, timeout=60, waiting=False).state == "completed"
    body = openai_server.requests[-1]["body"]["messages"]
    assert [m["content"] for m in body if m["role"] == "user"] == ["turn 1", "turn 2",
                                                                   "turn 3"]
    assert verify(client.log, second).ok


def test_a_turn_that_did_not_complete_is_passed_over_for_what_it_continued(
        client: Client, worker: WorkerFactory, model: ModelServer) -> None:
    client.registry.load(AGENTS)
    first = client.start("talker", {"say": "turn 1"}, run_id="po-1", session="pass").run_id
    worker(burst=True).wait(60)
    second = client.start("talker", {"say": "never"}, run_id="po-2", session="pass").run_id
    client.cancel(second, reason="the user took it back")
    assert client.wait(second, timeout=30).state == "canceled"  # before any worker took it
    third = client.start("talker", {"say": "turn 2"}, run_id="po-3", session="pass").run_id
    assert _started(client, third).continue_from == second  # the latest run, by reference
    worker(burst=True).wait(60)
    done = client.status(third)
    assert done.state == "completed" and done.result["turns"] == 2
    sent = model.requests(f"{third}:2")[-1].body["messages"]
    assert [m["content"].strip() for m in sent if m["role"] == "user"] == ["turn 1", "turn 2"]
    assert client.status(first).state == "completed"
    # A conversation that expired after its turn was started: the load says so.
    late = client.start("talker", {"say": "turn 3"}, run_id="po-4",
                        continue_from=third).run_id
    client.redis.delete(client.log.keys.log(third), client.log.keys.run(third),
                        client.log.keys.blobs(third))
    worker(burst=True).wait(60)
    failed = client.status(late)
    assert failed.state == "failed" and "no longer exists" in (failed.error or ""), failed


@pytest.mark.cluster
def test_a_claim_whose_start_died_is_taken_up_or_passed_over(
        client: Client, model: ModelServer) -> None:
    """The starter died between claiming the session and writing ``run_started``: the
    same start again takes its claim up; any other start is refused while the claim is
    fresh and passes over it once it is ``ABANDONED_MS`` old."""
    client.registry.load(AGENTS)
    r = client.redis
    assert sessions.claim(r, client.log.projection, "", "ghosts", "g-1", now_ms()) == ""
    with pytest.raises(SessionBusy, match="being started"):
        client.start("talker", {"say": "hi"}, run_id="g-2", session="ghosts")
    assert client.start("talker", {"say": "hi"}, run_id="g-1", session="ghosts").created
    assert _started(client, "g-1").session == "ghosts"
    old = now_ms() - sessions.ABANDONED_MS - 1
    assert sessions.claim(r, client.log.projection, "", "ghosts2", "h-1", old) == ""
    assert client.start("talker", {"say": "hi"}, run_id="h-2", session="ghosts2").created
    assert _started(client, "h-2").continue_from == ""  # what the abandoned claim continued
    assert [x.run_id for x in client.runs(session="ghosts2")] == ["h-2"]
    assert r.hget(keys.session("", "ghosts2"), "head") == b"h-2"


def test_start_many_takes_one_session_per_input(client: Client, model: ModelServer) -> None:
    client.registry.load(AGENTS)
    got = client.start_many("talker", [{"say": "a"}, {"say": "b"}], run_ids=["m-1", "m-2"],
                            sessions=["s-a", "s-b"])
    assert [s.created for s in got] == [True, True]
    assert [_started(client, run).session for run in ("m-1", "m-2")] == ["s-a", "s-b"]
    with pytest.raises(SessionBusy):  # s-b is busy: nothing of the batch is written
        client.start_many("talker", [{"say": "c"}, {"say": "d"}], run_ids=["m-3", "m-4"],
                          sessions=["s-c", "s-b"])
    assert client.log.projection("m-3") == {} and client.log.projection("m-4") == {}
    assert sessions.latest(client.redis, "", "s-c") == ""  # its claim was given back
    with pytest.raises(UsageError, match="repeat"):
        client.start_many("talker", [{"say": "c"}, {"say": "d"}], sessions=["s-d", "s-d"])


def test_an_older_run_started_reads_as_no_session() -> None:
    """A v4 ``run_started`` written before the field existed (positional, its trailing
    defaults cut off) reads as a run of no session."""
    old = msgspec.msgpack.encode([ev.CODES["run_started"], 4, 1, 0, "client", "talker", "1",
                                  {"say": "hi"}])
    event = ev.decode(old, "1700000000000-0", run="old-1")
    assert isinstance(event, ev.RunStarted)
    assert (event.session, event.continue_from, event.agent) == ("", "", "talker")
    new = ev.RunStarted(v=4, run="new-1", seq=1, ts=1, agent="talker", session="s")
    assert ev.decode(ev.encode(new), "1-0", run="new-1").session == "s"  # type: ignore[attr-defined]


def test_a_schedules_runs_are_turns_of_its_session(client: Client, model: ModelServer) -> None:
    """Each slot's run continues the session; a slot while the previous slot's run has not
    ended is refused (recorded as the schedule's error), not queued behind it."""
    client.registry.load(AGENTS)
    t0 = 1_900_000_000_000
    client.schedules.add("digest", "* * * * * *", "talker", {"say": "news?"}, now=t0 - 1,
                         session="daily", tenant="acme")
    assert client.schedules.sweep(now=t0 + 200) == {"digest": f"started digest-{t0 // 1000}"}
    done = client.schedules.sweep(now=t0 + 1200)
    assert done == {"digest": f"refused digest-{t0 // 1000 + 1}"}
    assert "has a run in progress" in client.schedules.get("digest").error
    client.cancel(f"digest-{t0 // 1000}")
    assert client.wait(f"digest-{t0 // 1000}", timeout=30).state == "canceled"
    assert client.schedules.sweep(now=t0 + 2200) == {
        "digest": f"started digest-{t0 // 1000 + 2}"}
    started = _started(client, f"digest-{t0 // 1000 + 2}")
    assert (started.session, started.tenant, started.continue_from) == (
        "daily", "acme", f"digest-{t0 // 1000}")


def test_repair_index_restores_lost_session_keys_and_names_unreadable_logs(
        client: Client, model: ModelServer, capsys: pytest.CaptureFixture[str]) -> None:
    """A session's two keys are deleted (a flushed or restored shard): ``repair-index``
    restores them from the turns the run logs record, so the next start is still refused
    while the latest turn runs, and then continues it. A session whose keys are there is
    left as it is, and a log that cannot be read is named, not passed over in silence."""
    client.registry.load(AGENTS)
    r = client.redis
    for n in (1, 2):
        client.start("talker", {"say": f"turn {n}"}, run_id=f"lost-{n}", session="lost",
                     tenant="acme")
        client.cancel(f"lost-{n}", reason="ended")
    client.start("talker", {"say": "turn 3"}, run_id="lost-3", session="lost", tenant="acme")
    client.start("talker", {"say": "hi"}, run_id="kept-1", session="kept")
    kept = r.hgetall(keys.session("", "kept"))
    r.delete(keys.session("acme", "lost"), keys.session_runs("acme", "lost"))
    r.xadd(client.log.keys.log("junk"), {"e": b"\xff not an event"})
    capsys.readouterr()
    assert main(["repair-index"]) == 1  # the unreadable log fails the command
    out = capsys.readouterr().out
    assert "reindexed 6 runs" not in out and "reindexed 4 runs" in out, out
    assert "restored the keys of 1 sessions: acme/lost" in out
    assert "not indexed: junk: its log cannot be read" in out
    head = {k.decode(): v.decode() for k, v in r.hgetall(keys.session("acme", "lost")).items()}
    assert (head["head"], head["from"], head["n"]) == ("lost-3", "lost-2", "3")
    assert r.hgetall(keys.session("", "kept")) == kept
    listed = [x.run_id for x in client.runs(session="lost", tenant="acme")]
    assert listed == ["lost-3", "lost-2", "lost-1"]
    with pytest.raises(SessionBusy, match="'lost-3' is pending"):
        client.start("talker", {"say": "turn 4"}, session="lost", tenant="acme")
    client.cancel("lost-3", reason="ended")
    fourth = client.start("talker", {"say": "turn 4"}, run_id="lost-4", session="lost",
                          tenant="acme").run_id
    assert _started(client, fourth).continue_from == "lost-3"
    assert r.zscore(keys.session_runs("acme", "lost"), fourth) == 4
