"""A run's input over the inline limit (a long message history handed to a new run, or to a
session's turn) is kept beside the run by reference (``durable.log.blobs``), for a code
agent, pydantic-ai and the OpenAI Agents SDK alike; past ``DURABLE_MAX_RESULT_BYTES`` it is
refused, nothing started. Real worker processes and real SIGKILLs; the models are the local
OpenAI-compatible servers of ``tests.servers``, which see every message of each request.
The tests marked ``cluster`` run on a real 3-master cluster with ``pytest --cluster``."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis
from redis.crc import key_slot

from durable import conversations
from durable.agents import registry
from durable.audit import replay
from durable.audit.verify import verify
from durable.cli.main import main
from durable.client import Client
from durable.errors import PayloadTooLarge, RunIdConflict, UsageError
from durable.log import blobs, context
from durable.log import events as ev
from durable.log.state import STATE_INPUT_REF
from durable.log.store import EventLog
from durable.settings import Settings
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.runs import events_of
from tests.servers.model import ModelServer
from tests.servers.openai import OpenAIServer

AGENTS = "examples.agents,tests.agents.basic,tests.agents.model_steps,tests.agents.sessions"
KB = 1000
BIG = 320 * KB  # characters of the earlier user message: the input is past 256 KiB


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
    monkeypatch.setenv("TEST_PAGE_CHARS", "1000")
    yield srv
    srv.stop()


def chat_history() -> list[dict[str, Any]]:
    """An earlier conversation in chat messages, past the inline limit."""
    return [{"role": "user", "content": "turn 1 " + "h" * BIG},
            {"role": "assistant", "content": "noted"}]


def pai_history() -> list[dict[str, Any]]:
    """The same conversation as pydantic-ai's messages (JSON)."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

    from durable.integrations.pydantic_ai import prompt_input
    return list(prompt_input(None, [ModelRequest(parts=[UserPromptPart("turn 1 " + "h" * BIG)]),
                                    ModelResponse(parts=[TextPart("noted")])]
                             )["message_history"])


#: Per framework: the agent, its input with the history and this turn's words, and its
#: input with a turn's words alone.
CASES: dict[str, tuple[str, Callable[[], dict[str, Any]], Callable[[str], dict[str, Any]]]] = {
    "code": ("talker", lambda: {"say": "turn 2", "history": chat_history()},
             lambda say: {"say": say}),
    "pydantic_ai": ("pai_reader", lambda: {"prompt": "turn 2", "message_history": pai_history()},
                    lambda say: {"prompt": say}),
    "openai_agents": ("oai_reader",
                      lambda: {"input": [*chat_history(), {"role": "user", "content": "turn 2"}]},
                      lambda say: {"input": say}),
}


def started_event(client: Client, run: str) -> ev.RunStarted:
    first = events_of(client, run)[0]
    assert isinstance(first, ev.RunStarted)
    return first


def user_texts(messages: list[dict[str, Any]]) -> list[str]:
    """The text of each user message a model request carried, its first 6 characters."""
    return [str(m["content"])[:6] for m in messages if m["role"] == "user"]


def check_kept_beside(client: Client, r: redis.Redis, run: str, at_least: int) -> None:
    """The run's input is a reference in its log (digest and size), the value stored once
    beside the run in the run's slot, and every reader of the log still works."""
    started = started_event(client, run)
    ref = started.input_blob
    assert started.input is None and ref is not None and ref.field == blobs.INPUT
    assert ref.size > at_least
    k = client.log.keys
    stored = r.hget(k.blobs(run), ref.field)
    assert stored is not None and hashlib.sha256(stored).hexdigest() == ref.sha256
    assert key_slot(k.blobs(run).encode()) == key_slot(k.log(run).encode())
    assert max(len(fields[b"e"]) for _, fields in r.xrange(k.log(run))) < 8192
    report = verify(client.log, run)
    assert report.ok and report.checks["large_values"] == "ok", report.checks
    shown = replay.replay(client.log, run).rows[0]["what"]
    assert f"its input: large value of {ref.size} bytes" in shown


@pytest.mark.cluster
@pytest.mark.parametrize("framework", list(CASES))
def test_a_300kb_history_handed_to_a_session_turn_survives_a_kill_before_its_first_step(
        framework: str, client: Client, r: redis.Redis, worker: WorkerFactory,
        reconciler: ReconcilerFactory, model: ModelServer, openai_server: OpenAIServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A session's first turn is started with a 320 KB history in its input: kept beside the
    run. The worker is SIGKILLed after the run started and its first step's intent was
    recorded, before that step was sent (``after_intent:1``: the input was read back from
    beside the run once already); another worker reads it back again and completes the
    turn, the model having seen the whole history, each request sent once. The next turn of
    the session, with a small input, continues the kept conversation, history included."""
    agent, big, small = CASES[framework]
    client.registry.load(AGENTS)
    run = client.start(agent, big(), run_id=f"{framework}-1", session=f"s-{framework}").run_id
    check_kept_beside(client, r, run, BIG)
    assert worker(kill_at="after_intent:1").wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=90, waiting=False)
    assert final.state == "completed", (final.state, final.error, final.reason)
    if framework == "code":
        sent = [s.body["messages"] for s in model.seen]
        assert [s.key for s in model.seen] == [f"{run}:2"]  # the chat: once
    else:
        sent = [q["body"]["messages"] for q in openai_server.requests]
        assert openai_server.counts(run) == {f"{run}:1": 1, f"{run}:3": 1}
    assert all(user_texts(m) == ["turn 1", "turn 2"] for m in sent)  # the whole history
    assert all(len(str(next(u for u in m if u["role"] == "user")["content"])) > BIG
               for m in sent)
    check_kept_beside(client, r, run, BIG)
    capsys.readouterr()
    assert main(["log", run]) == 0
    ref = started_event(client, run).input_blob
    assert ref is not None and f"its input: large value of {ref.size}" in \
        capsys.readouterr().out

    after = client.start(agent, small("turn 3"), run_id=f"{framework}-2",
                         session=f"s-{framework}").run_id
    done = client.wait(after, timeout=90, waiting=False)
    assert done.state == "completed", (done.state, done.error, done.reason)
    last = model.seen[-1].body["messages"] if framework == "code" else \
        openai_server.requests[-1]["body"]["messages"]
    assert user_texts(last) == ["turn 1", "turn 2", "turn 3"]
    assert len(msgspec.json.encode(started_event(client, after).input)) < 200  # inline
    kept = conversations.kept(client, after)
    assert kept is not None and len(msgspec.json.encode(kept)) > BIG
    assert verify(client.log, after).ok


def test_an_input_past_the_large_value_limit_is_refused_and_nothing_started(
        r: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Past ``DURABLE_MAX_RESULT_BYTES`` (or the run's ``DURABLE_BLOB_BUDGET_BYTES``) an
    input is refused with ``PayloadTooLarge`` naming the setting: no log, no value beside
    it, no session claimed (the session's next start is its first turn), from the client,
    ``start_many`` and the CLI alike."""
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    monkeypatch.setenv("DURABLE_MAX_RESULT_BYTES", str(300 * KB))
    client = Client(Settings(), r)
    client.registry.load(AGENTS)
    big = {"say": "hi", "history": chat_history()}
    with pytest.raises(PayloadTooLarge, match=r"the input \(kept beside the run up to "
                       r"DURABLE_MAX_RESULT_BYTES\) is \d+ bytes, over the limit of 300000"):
        client.start("talker", big, run_id="huge", session="s-huge")
    with pytest.raises(PayloadTooLarge, match="DURABLE_MAX_RESULT_BYTES"):
        client.start_many("talker", [{"say": "small"}, big], run_ids=["ok", "huge"])
    k = client.log.keys
    for run in ("huge", "ok"):
        assert not r.exists(k.log(run)) and not r.exists(k.run(run))
        assert not r.exists(k.blobs(run))
    assert client.runs(session="s-huge") == []
    turn = client.start("talker", {"say": "hi"}, run_id="first", session="s-huge").run_id
    assert started_event(client, turn).continue_from == ""  # the session's first turn
    capsys.readouterr()
    assert main(["start", "talker", "--input", msgspec.json.encode(big).decode()]) == 2
    assert "DURABLE_MAX_RESULT_BYTES" in capsys.readouterr().err

    monkeypatch.setenv("DURABLE_MAX_RESULT_BYTES", str(16 * 1000 * KB))
    monkeypatch.setenv("DURABLE_BLOB_BUDGET_BYTES", str(300 * KB))
    with pytest.raises(PayloadTooLarge, match="DURABLE_BLOB_BUDGET_BYTES"):
        Client(Settings(), r).start("talker", big, run_id="huge")
    assert not r.exists(k.log("huge")) and not r.exists(k.blobs("huge"))


def test_a_large_input_costs_no_round_trip_more_and_a_small_one_no_byte_more(
        client: Client, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start sends the same commands whatever its input's size (its value goes with
    ``run_started``, in the same script call), and a small input's ``run_started`` holds
    no reference field: its bytes are what they were before inputs could be kept beside."""
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    client.registry.load(AGENTS)
    client.start("talker", {"say": "warm"}, run_id="warm", enqueue=False)  # the catalog

    sent: list[int] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(1)  # one request written to the server: a round trip
        send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)

    def round_trips(run: str, data: dict[str, Any]) -> int:
        sent.clear()
        client.start("talker", data, run_id=run, enqueue=False)
        return len(sent)

    small = round_trips("small", {"say": "hi"})
    assert small > 0 and small == round_trips("large", {"say": "hi", "history": chat_history()})
    k = client.log.keys
    assert not r.exists(k.blobs("small")) and r.hlen(k.blobs("large")) == 1
    (_, fields), = r.xrange(k.log("small"))
    wire = msgspec.msgpack.decode(fields[b"e"])
    own = [f.name for f in msgspec.structs.fields(ev.RunStarted) if f.name not in ev.ENVELOPE]
    assert len(wire) - 5 <= own.index("input_blob")  # the field is left out of the wire form
    assert started_event(client, "small").input == {"say": "hi", "pad": 0, "history": []}


@pytest.mark.cluster
def test_a_large_input_started_again_is_the_same_run_and_start_many_keeps_it_beside(
        client: Client, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    client.registry.load(AGENTS)
    big = {"say": "hi", "history": chat_history()}
    first = client.start("talker", big, run_id="same", enqueue=False)
    again = client.start("talker", big, run_id="same", enqueue=False)
    assert first.created and not again.created
    with pytest.raises(RunIdConflict, match="a different input"):
        client.start("talker", {**big, "say": "other"}, run_id="same", enqueue=False)
    k = client.log.keys
    assert r.xlen(k.log("same")) == 1 and r.hlen(k.blobs("same")) == 1
    started = client.start_many("talker", [big, {"say": "small"}], run_ids=["m1", "m2"],
                                enqueue=False)
    assert [s.created for s in started] == [True, True]
    assert started_event(client, "m1").input_blob is not None
    assert started_event(client, "m2").input_blob is None and not r.exists(k.blobs("m2"))
    for run in ("same", "m1", "m2"):
        assert verify(client.log, run).ok


CARD = "4111222233334444"


def test_a_decide_agents_large_sealed_input_is_read_back_whole_after_a_kill(
        r: redis.Redis, settings: Settings, worker: WorkerFactory,
        reconciler: ReconcilerFactory, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``decide(state)`` agent's 320 KB input with a sensitive field: the field is sealed
    in the value kept beside the run, and clear in what the agent reads. SIGKILL after the
    card was charged (step 1's effect), before its outcome was recorded: the next worker
    reads the input back, re-decides the recorded call from it (the same card, the same
    amount: no nondeterminism), resolves the key by lookup and charges nothing again. The
    run's archive carries the value, sealed, and verifies on its own."""
    monkeypatch.setenv("DURABLE_ENCRYPTION_KEYS",
                       f"k1:{base64.b64encode(os.urandom(32)).decode()}")
    monkeypatch.setenv("DURABLE_AGENTS", "examples.agents,tests.agents.basic,"
                                         "tests.agents.sensitive")
    monkeypatch.setenv("TEST_SEEN_FILE", str(tmp_path / "seen.txt"))
    client = Client(Settings(), r)
    holder = "Ann " + "a" * BIG
    run = client.start("secret_checkout", {"holder": holder, "card_number": CARD,
                                           "amount": 7}, run_id="card").run_id
    stored = r.hget(client.log.keys.blobs(run), blobs.INPUT)
    assert stored is not None and len(stored) > BIG
    assert CARD.encode() not in stored and b"_sealed" in stored
    assert worker(kill_at="after_effect:1").wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["holder"] == holder
    charged = (tmp_path / "seen.txt").read_text().splitlines()
    assert charged == [f"{run}:1 {CARD}"]  # once, with the card in clear
    assert verify(client.log, run).ok
    # A replay that re-decides the log (``durable deploy check``) reads the input too.
    reader = EventLog.from_settings(r, Settings(), open_sealed=True)
    assert replay.check_determinism(reader, run, registry.agent("secret_checkout")) == 1
    # The archive carries the value as stored (sealed) and checks it on its own.
    ref = started_event(client, run).input_blob
    assert ref is not None
    capsys.readouterr()
    assert main(["archive", "--older-than", "1ms", "--to", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["archived"] == [run]
    assert not r.exists(client.log.keys.blobs(run))
    with gzip.open(tmp_path / f"{run}.jsonl.gz", "rt") as f:
        (kept,) = [line for line in map(json.loads, f) if line["kind"] == "blob"]
    assert (kept["field"], kept["sha256"]) == (blobs.INPUT, ref.sha256)
    assert CARD not in kept["data"]
    assert main(["verify-archive", str(tmp_path / f"{run}.jsonl.gz")]) == 0


def test_a_fork_copies_the_input_and_context_retention_removes_it_with_the_rest(
        r: redis.Redis, settings: Settings, worker: WorkerFactory, model: ModelServer,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """With ``DURABLE_CONTEXT_RETENTION`` an input kept beside the run is model context:
    a fork keeps its own copy; the trim of the ended run removes it with the other context
    values, and the run still verifies and shows what was removed. ``DURABLE_RETENTION``
    expires it with the run's other keys."""
    monkeypatch.setenv("DURABLE_CONTEXT_RETENTION", "1h")
    monkeypatch.setenv("DURABLE_RETENTION", "1h")
    client = Client(Settings(), r)
    client.registry.load(AGENTS)
    run = client.start("talker", {"say": "turn 2", "history": chat_history()},
                       run_id="ctx").run_id
    worker(burst=True).wait(120)
    assert client.status(run).state == "completed"
    k = client.log.keys
    assert 0 < r.pttl(k.blobs(run)) <= 3_600_000  # expires with the run
    started = started_event(client, run)
    assert started.input_blob is not None and started.input_blob.context
    first = client.events(run)[0].id
    replay.fork(client.log, run, first, "ctx-fork")
    assert r.hget(k.blobs("ctx-fork"), blobs.INPUT) == r.hget(k.blobs(run), blobs.INPUT)
    assert verify(client.log, "ctx-fork").ok

    trimmed = context.trim(client.log, run, "DURABLE_CONTEXT_RETENTION=1h")
    assert trimmed is not None and blobs.INPUT in trimmed.refs
    assert not r.exists(k.blobs(run))
    report = verify(client.log, run)
    assert report.ok, report.checks
    assert "model context values removed by policy" in report.checks["context"]
    assert client.status(run).input is None
    capsys.readouterr()
    assert main(["log", run]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "its input" in x)
    assert "model context of" in line and "REMOVED" in line
    with pytest.raises(UsageError, match="input was model context"):
        replay.fork(client.log, run, first, "ctx-fork-2")


def test_a_checkpoint_keeps_the_inputs_reference_and_a_recovery_reads_it_back(
        client: Client, r: redis.Redis, settings: Settings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint of a run whose input is beside it holds the reference, not the value,
    as state layout 2 (a reader of layout 1 alone folds the whole log instead, and refuses
    the ``run_started`` it cannot read); a recovery from it reads the input back whole."""
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    client.registry.load(AGENTS)
    big = {"say": "hi", "pad": 0, "history": chat_history()}
    run = client.start("talker", big, run_id="ckpt", enqueue=False).run_id
    reader = EventLog.from_settings(r, settings, open_sealed=True)
    handle = reader.load(run)
    assert handle.state.input == big
    reader.commit(handle, [], checkpoint=True)
    assert handle.state.input == big  # the writer's state keeps the value it was given
    (entry_id, fields), = r.xrevrange(client.log.keys.log(run), count=1)
    assert len(fields[b"e"]) < 4096
    snap = client.log.read(run, entry_id.decode())[0].event
    assert isinstance(snap, ev.Checkpoint) and snap.state_v == STATE_INPUT_REF
    assert snap.state.input is None and snap.state.input_blob is not None
    again = reader.load(run)
    assert again.ckpt_seq == again.state.version == 2  # folded from the checkpoint
    assert again.state.input == big
    assert client.status(run).input is None  # a reader that runs no agent code: the reference
    assert verify(client.log, run).ok
