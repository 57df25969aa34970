"""Bad input gets a clear error and loses nothing; the worker never crashes on it."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from durable.agents import Agent, Call, Decision, Tool, ToolContext, register
from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.log.state import RunState
from durable.log.store import RunHandle, Spec
from durable.queue import ADVANCE, DRAIN, LEGACY_HANDLERS
from durable.workers.loop import StepLoop
from tests.agents.basic import EchoInput
from tests.conftest import WorkerFactory


@register
class Hoarder(Tool):
    """Returns a result that is too big, or not plain data."""

    name = "hoarder"

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return object() if args.get("odd") else "x" * 600_000


@register
class Greedy(Agent):
    name = "greedy"
    input_model = EchoInput
    tools = ("hoarder",)

    def decide(self, state: RunState) -> Decision:
        from durable.agents import Finish

        if state.step >= 2:
            return Finish([a.result for a in state.actions.values()])
        return Call("hoarder" if state.input["text"] != "bad-tool" else "nope",
                    {"odd": state.step == 1})


def _driver(client: Client) -> StepLoop:
    from durable.agents import registry

    return StepLoop(client.settings, client.redis, registry, "test-worker")


def test_a_run_of_an_agent_this_worker_lacks_waits_on_that_agents_list(
    client: Client, r: redis.Redis
) -> None:
    """Routing: a worker that takes a run of an agent it does not have (from the shared
    list) neither quarantines nor drives it: the run goes on its agent's ready list, where
    a worker that has the agent takes it, and its log is left as it was."""
    handle = RunHandle("ghost", RunState(), actor="t")
    client.log.commit(handle, [Spec(ev.RunStarted, {"agent": "ghost-agent", "input": {}})])
    version = client.status("ghost").version
    assert _driver(client).advance("ghost")["run"] == "ghost"
    state = client.status("ghost")
    assert state.state == "pending" and state.version == version
    assert r.lrange(keys.ready(client.queue.name, "ghost-agent"), 0, -1) == [b"ghost"]
    assert not r.exists(client.log.keys.lease("ghost"))


def test_an_agent_deciding_an_unknown_tool_is_quarantined(client: Client) -> None:
    client.start("greedy", {"text": "bad-tool"}, run_id="badtool", enqueue=False)
    _driver(client).advance("badtool")
    state = client.status("badtool")
    assert state.state == "quarantined" and "unknown tool 'nope'" in (state.reason or "")
    assert state.step == 0  # nothing was decided, nothing sent


def test_large_results_are_kept_whole_and_odd_ones_fail_their_step(client: Client) -> None:
    """A result over the inline limit reaches the agent whole (kept beside the run); one
    that is not plain data fails its step with the reason. Neither is replaced."""
    client.start("greedy", {"text": "ok"}, run_id="hoard", enqueue=False)
    _driver(client).advance("hoard")
    state = client.status("hoard")
    assert state.state == "completed"
    first, second = state.result
    assert first == "x" * 600_000 and second is None
    kept, odd = state.actions[1], state.actions[2]
    assert kept.blob is not None and kept.blob.size == 600_002 and kept.result is None
    assert odd.status == "failed" and odd.error_type == "TypeError"
    assert "not plain data" in (odd.error or "")


def test_malformed_commands_are_refused_and_the_worker_keeps_going(
    client: Client, worker: WorkerFactory, r: redis.Redis
) -> None:
    client.queue.enqueue_call(func=ADVANCE, args=("bad {id}",))
    client.queue.enqueue_call(func=DRAIN, args=("other-queue",))
    client.queue.enqueue_call(func=ADVANCE, args=(12,))
    client.start("count", {"steps": 1}, run_id="after-junk")
    assert worker(burst=True).wait(60) == 0
    assert client.status("after-junk").state == "completed"
    assert int(r.hget(keys.STATS, "malformed_commands") or 0) == 3


@pytest.mark.parametrize("old", sorted({name.rpartition(".")[0] for name in LEGACY_HANDLERS}))
def test_jobs_queued_under_an_earlier_release_handler_names_still_run(
    old: str, client: Client, worker: WorkerFactory, r: redis.Redis
) -> None:
    """Jobs queued before an upgrade name ``durable.commands.*`` (the first release) or
    ``workers.handlers.*`` (before the worker was ``durable.workers``): they run as the
    handlers those became, for one release."""
    client.start("count", {"steps": 2}, run_id="old-advance", enqueue=False)
    client.start("count", {"steps": 2}, run_id="old-drain", enqueue=False)
    client.queue.enqueue_call(func=f"{old}.advance", args=("old-advance",))
    r.rpush(keys.ready(client.queue.name), "old-drain")
    client.queue.enqueue_call(func=f"{old}.drain", args=(client.queue.name,))
    assert worker(burst=True).wait(60) == 0
    assert client.status("old-advance").state == "completed"
    assert client.status("old-drain").state == "completed"
    assert r.hget(keys.STATS, "forged_jobs") is None


@pytest.mark.parametrize("payload", [
    b"\x00\x01", b"{}", b'{"run": 5}', b'{"run":"x","scope":"all"}',
])
def test_malformed_pubsub_messages_change_nothing(payload: bytes, client: Client,
                                                  r: redis.Redis) -> None:
    from durable.workers.listener import CancelListener

    client.start("count", {"steps": 1}, run_id="x", enqueue=False)
    before = client.status("x").version
    listener = CancelListener(client.settings, r, _driver(client))
    listener.handle(payload)
    assert listener.report(force=True) == {"malformed": 1}
    assert int(r.hget(keys.STATS, "cancel_malformed") or 0) == 1
    assert client.status("x").version == before
