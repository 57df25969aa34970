"""Sensitive fields: sealed with AES-GCM in the log and the AOF, in clear for the tool,
``***`` in ``durable log``/``status``/``export`` unless the caller holds the key; keys
rotate by adding one in front."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from durable.client import Client
from durable.errors import UsageError
from durable.log.keys import KeyLayout
from durable.security.sealing import Keyring, is_envelope
from durable.settings import Settings
from durable.testing import Server, wait_for
from tests.conftest import ApproverFactory, WorkerFactory

CARD = "4111222233334444"
AGENTS = "examples.agents,tests.agents.basic,tests.agents.sensitive"


def new_key(kid: str) -> str:
    return f"{kid}:{base64.b64encode(os.urandom(32)).decode()}"


@pytest.fixture()
def keyed(settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    key = new_key("k1")
    monkeypatch.setenv("DURABLE_ENCRYPTION_KEYS", key)
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    monkeypatch.setenv("TEST_SEEN_FILE", str(tmp_path / "seen.txt"))
    return key


def durable(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable", *args],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)


def aof_bytes(server: Server) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(server.data_dir.rglob("*.aof*"))
                    if p.is_file())


def raw_log(r: redis.Redis, run_id: str) -> bytes:
    return b"".join(f[b"e"] for _, f in r.xrange(f"dx:{{{run_id}}}:log"))


def test_sensitive_fields_are_sealed_at_rest_and_clear_for_the_tool(
        keyed: str, server: Server, r: redis.Redis, worker: WorkerFactory,
        tmp_path: Path) -> None:
    """The card number (a SecretStr input and a tool argument) and the authorization code
    (a tool result, then the agent's result) never reach Redis in clear."""
    client = Client(Settings(), r)
    client.start("secret_checkout", {"holder": "Ann", "card_number": CARD, "amount": 7},
                 run_id="sealed1")
    worker()
    state = client.wait("sealed1", 60)
    assert state.state == "completed", (state.reason, state.error)

    seen = (tmp_path / "seen.txt").read_text()
    assert f"sealed1:1 {CARD}" in seen                       # the tool got it in clear
    auth = "AUTH-4444-sealed1:1"
    stream = raw_log(r, "sealed1")
    assert b"_sealed" in stream and b"secret_checkout" in stream  # it is there, sealed
    assert CARD.encode() not in stream and auth.encode() not in stream
    assert b"Ann" in stream                                     # what is not sensitive stays
    assert wait_for(lambda: b"sealed1:1" in aof_bytes(server), 10)
    aof = aof_bytes(server)
    assert CARD.encode() not in aof and auth.encode() not in aof

    # A reader holding the key sees the values; the folded state of a worker has them too.
    started = client.log.read("sealed1", count=1)[0].event
    assert started is not None and is_envelope(started.input["card_number"])  # type: ignore[attr-defined]

    # No key: masked everywhere it is shown.
    env = {"DURABLE_ENCRYPTION_KEYS": ""}
    commands: list[tuple[str, ...]] = [
        ("log", "sealed1", "--json"), ("log", "sealed1"), ("status", "sealed1"),
        ("status", "sealed1", "--json"), ("export", "sealed1"), ("replay", "sealed1", "--json")]
    for args in commands:
        shown = durable(*args, **env)
        assert shown.returncode == 0, (args, shown.stderr)
        assert CARD not in shown.stdout and auth not in shown.stdout, args
        assert "***" in shown.stdout, args
        assert "Ann" in shown.stdout or args[0] == "status", args
    # The key's holder sees them.
    shown = durable("log", "sealed1", "--json")
    assert CARD in shown.stdout and auth in shown.stdout
    exported = [json.loads(line) for line in durable("export", "sealed1").stdout.splitlines()]
    done = next(e for e in exported if e.get("type") == "completed")
    assert done["result"] == {"receipt": auth, "holder": "Ann"}


def test_rotation_new_key_seals_old_key_still_opens(
        keyed: str, r: redis.Redis, worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """A run sealed under k1 is still driven and read after k2 is put in front; new runs are
    sealed with k2; a process holding only k2 cannot read k1's values (masked) and a worker
    missing k1 quarantines that run instead of guessing."""
    Client(Settings(), r).start("secret_checkout", {"holder": "Bo", "card_number": CARD},
                                run_id="old1", enqueue=False)
    k2 = new_key("k2")
    monkeypatch.setenv("DURABLE_ENCRYPTION_KEYS", f"{k2},{keyed}")
    client = Client(Settings(), r)
    client.start("secret_checkout", {"holder": "Cy", "card_number": CARD}, run_id="new1")
    client.enqueue("old1")
    first = worker()
    assert client.wait("old1", 60).state == "completed"
    assert client.wait("new1", 60).state == "completed"
    kids = {run: json.loads(json.dumps(client.log.read(run, count=1)[0].event.input))  # type: ignore[union-attr]
            ["card_number"]["kid"] for run in ("old1", "new1")}
    assert kids == {"old1": "k1", "new1": "k2"}

    # Holding only k2: the input sealed under k1 is masked; what the worker wrote after the
    # rotation is sealed with k2, and shown.
    only_k2 = [json.loads(line) for line in
               durable("log", "old1", "--json", DURABLE_ENCRYPTION_KEYS=k2).stdout.splitlines()]
    assert only_k2[0]["input"]["card_number"] == "***"
    decided = next(e for e in only_k2 if e["type"] == "step_decided")
    assert decided["args"]["card_number"] == CARD

    first.stop()
    # Sealed with k1, driven by a worker holding only k2.
    monkeypatch.setenv("DURABLE_ENCRYPTION_KEYS", keyed)
    Client(Settings(), r).start("secret_checkout", {"holder": "Di", "card_number": CARD},
                                run_id="k1only", enqueue=False)
    monkeypatch.setenv("DURABLE_ENCRYPTION_KEYS", k2)
    worker()
    client.enqueue("k1only")
    state = client.wait("k1only", 60)
    assert state.state == "quarantined", state
    assert "k1" in (state.reason or "")


def test_without_keys_nothing_sensitive_is_written(settings: Settings, r: redis.Redis,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A start whose input has sensitive fields is refused without keys (nothing written),
    and a worker serving sensitive tools refuses to start without keys (one line, exit 2)."""
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    monkeypatch.delenv("DURABLE_ENCRYPTION_KEYS", raising=False)
    client = Client(Settings(), r)
    with pytest.raises(UsageError, match="DURABLE_ENCRYPTION_KEYS"):
        client.start("secret_checkout", {"holder": "Ed", "card_number": CARD}, run_id="nokey")
    assert not r.exists("dx:{nokey}:log")
    done = durable("worker", "--burst")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "DURABLE_ENCRYPTION_KEYS" in done.stderr


@pytest.mark.parametrize("text,said", [
    ("k1", "id:base64key"), ("k1:not base64!", "not base64"),
    ("k1:" + base64.b64encode(b"short").decode(), "not 32"),
])
def test_bad_keys_are_one_line_usage_errors(text: str, said: str) -> None:
    with pytest.raises(UsageError, match=said) as err:
        Keyring.parse(text)
    assert "\n" not in str(err.value)


def test_envelope_altered_does_not_open() -> None:
    ring = Keyring.parse(new_key("k1"))
    env = ring.seal({"x": 1})
    assert ring.open(env) == {"x": 1}
    env["ct"] = base64.b64encode(b"\0" * 24).decode()
    with pytest.raises(Exception, match="does not open"):
        ring.open(env)


def test_checkpoint_seals_what_the_worker_holds_in_clear(layout: KeyLayout, r: redis.Redis) -> None:
    """A worker's folded state holds the opened values; the checkpoint it writes seals them
    again (input, arguments, results), and a worker reading it back gets them in clear."""
    from durable.log import events as ev
    from durable.log.state import Action, RunState
    from durable.log.store import EventLog, RunHandle, Spec

    ring = Keyring.parse(new_key("k1"))
    elog = EventLog(r, keyring=ring, open_sealed=True, sealed_names={"card_number", "auth"},
                    layout=layout)
    handle = RunHandle("ckpt1", RunState(), actor="test")
    elog.commit(handle, [Spec(ev.RunStarted, {"agent": "a", "agent_version": "1",
                                              "input": {"card_number": CARD}})])
    handle.state.actions[1] = Action(step=1, tool="t", key="ckpt1:1",
                                     args={"card_number": CARD}, result={"auth": "A-1"},
                                     status="succeeded")
    elog.commit(handle, [], checkpoint=True)
    raw = raw_log(r, "ckpt1")
    assert any(isinstance(e.event, ev.Checkpoint) for e in EventLog(r, layout=layout).read("ckpt1"))
    assert CARD.encode() not in raw and b"A-1" not in raw
    loaded = elog.load("ckpt1")
    assert loaded.state.input == {"card_number": CARD}
    assert loaded.state.actions[1].result == {"auth": "A-1"}


def test_an_answer_with_a_sensitive_field_is_sealed(keyed: str, r: redis.Redis,
                                                    worker: WorkerFactory,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``respond`` seals the fields the waiting run's agent marks sensitive; the agent gets
    them in clear; without keys the answer is refused and nothing is written."""
    client = Client(Settings(), r)
    client.start("secret_asker", {}, run_id="otp1")
    worker()
    assert client.wait("otp1", 60).state == "waiting_input"
    monkeypatch.setenv("DURABLE_ENCRYPTION_KEYS", "")
    before = r.xlen(keys_log("otp1"))
    with pytest.raises(UsageError, match="DURABLE_ENCRYPTION_KEYS"):
        Client(Settings(), r).respond("otp1", {"otp": "918273"})
    assert r.xlen(keys_log("otp1")) == before
    client.respond("otp1", {"otp": "918273"})
    state = client.wait("otp1", 60)
    assert state.state == "completed" and state.result == {"otp_length": 6, "clear": True}
    assert b"918273" not in raw_log(r, "otp1")


def keys_log(run_id: str) -> str:
    return f"dx:{{{run_id}}}:log"


def test_approval_digest_is_over_the_values_in_clear(keyed: str, r: redis.Redis,
                                                     worker: WorkerFactory,
                                                     approver: ApproverFactory) -> None:
    """The approval is bound to the digest of the arguments in clear: after the wait, the
    worker that takes the run again opens the sealed arguments and recomputes the same
    digest (over envelopes, with their random nonces, it never would), so the approved call
    runs."""
    from durable.controls.digests import digest

    alice = approver("alice", "finance")
    client = Client(Settings(), r)
    client.start("secret_payer", {"holder": "Fay", "card_number": CARD, "amount": 9},
                 run_id="appr1")
    first = worker()
    state = client.wait("appr1", 60)
    assert state.state == "waiting_approval", (state.reason, state.error)
    first.stop()  # the approved call is run by another worker, from the log
    request = next(iter(state.approvals.values()))
    assert request.digest == digest("approved_charge", {"card_number": CARD, "amount": 9}, {})
    client.sign_and_approve("appr1", request.request, "approve", "alice", alice)
    worker()
    state = client.wait("appr1", 60)
    assert state.state == "completed" and state.result == {"status": "succeeded"}, \
        (state.reason, state.error, state.result)
    assert CARD.encode() not in raw_log(r, "appr1")
