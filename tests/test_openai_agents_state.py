"""What an OpenAI Agents SDK run holds besides its steps' results, kept through crashes and
across providers: the run context a handoff's ``on_handoff`` changed, and the tokens a
streamed reply used (``durable.integrations.openai_agents``).

Real worker processes, SIGKILLed for real, against the local OpenAI-compatible server of
``tests.servers.openai`` (which, like vLLM, LiteLLM or Ollama, ends a stream with its usage
only when asked); the callback's and the tool's effects go into a SQLite database that never
deduplicates (``TEST_DB_DEDUPE=0``).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from pydantic import BaseModel

from durable.audit.verify import verify
from durable.client import Client
from durable.integrations.openai_agents import handoffs
from durable.log import events as ev
from tests.agents import openai_agents  # noqa: F401  (the agents, registered for starts)
from tests.agents.basic import applications
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.servers.integration_world import decided
from tests.servers.openai import OpenAIServer

pytestmark = pytest.mark.usefixtures("openai_env")

GATE_STEPS = ["oai_gate.model", "oai_gate.handoff", "oai_gate.model", "oai_gate.tool.board",
              "oai_gate.model"]


def _seat(client: Client, run: str) -> str:
    """The seat the handoff's callback chose, as its step recorded it."""
    (recorded,) = [e.event.result for e in client.events(run)
                   if isinstance(e.event, ev.ActionSucceeded) and e.event.step == 2]
    assert recorded["agent"] == "boarding"
    return str(recorded["context"]["set"]["seat"]["number"])


def test_a_streamed_reply_counts_its_tokens_against_the_budget(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    """The server is not OpenAI's, so the SDK would not ask it for the stream's usage: the
    model step asks, the 10 tokens of each reply count, and the fourth reply (40 tokens
    against a budget of 35) ends the run ``budget_exhausted`` instead of 16 replies later."""
    run = client.start("oai_tokens", {"input": "count"}, run_id="otk").run_id
    worker(burst=True).wait(60)
    state = client.status(run)
    assert (state.state, state.reason) == ("failed", "budget_exhausted"), state.error
    assert (state.model_calls, state.tokens) == (4, 40)
    assert len(openai_server.counts(run)) == 4
    assert all(r["stream"] and r["body"]["stream_options"] == {"include_usage": True}
               for r in openai_server.requests)


def test_a_handoffs_context_change_reaches_the_next_agents_tool(
    client: Client, worker: WorkerFactory, tmp_path: Path, openai_server: OpenAIServer
) -> None:
    run = client.start("oai_gate", {"input": "board ada"}, run_id="og").run_id
    worker(burst=True).wait(60)
    state = client.status(run)
    assert state.state == "completed", (state.state, state.reason, state.error)
    assert [s.tool for s in decided(client, run)] == GATE_STEPS
    seat = _seat(client, run)
    assert state.result == f"boarded: ada in {seat}"
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:2": 1, f"{run}:4": 1}
    assert verify(client.log, run).ok


@pytest.mark.parametrize(("window", "callbacks"), [
    ("after_outcome", 1),  # the handoff recorded: its callback is never run again
    ("after_effect", 2),   # the callback ran, unrecorded: run again (at least once, keyed)
])
def test_a_handoffs_context_change_survives_a_crash(
    window: str, callbacks: int, client: Client, worker: WorkerFactory,
    reconciler: ReconcilerFactory, tmp_path: Path, openai_server: OpenAIServer,
) -> None:
    """SIGKILL at the handoff step's ``window`` (step 2: after its ``on_handoff`` set the
    seat in the run context, before or after the step's outcome was recorded); another
    worker re-executes the run on a fresh context. The seat the recorded callback chose is
    restored into it, so boarding's tool sees it (it raises without one, and the SDK would
    tell the model of the error while the run completed): the tool boards once, on that
    seat, and a recorded callback is never run again."""
    run = client.start("oai_gate", {"input": "board ada"}, run_id=f"ogk{window[6]}").run_id
    doomed = worker(kill_at=f"{window}:2")
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert [s.tool for s in decided(client, run)] == GATE_STEPS
    assert str(final.result).startswith("boarded: ada in "), final.result
    assert final.result == f"boarded: ada in {_seat(client, run)}"
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:2": callbacks,
                                                             f"{run}:4": 1}
    assert verify(client.log, run).ok


# The record of a callback's changes, and their restoring by the types the context declares.


@dataclass
class Booking:
    day: date
    seats: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)
    loose: Any = None


class Profile(BaseModel):
    name: str
    since: date | None = None


def _changed(context: Any, change: Any) -> dict[str, Any] | None:
    before = handoffs.snapshot(context)
    change(context)
    return handoffs.changes("transfer", before, context, context)


def test_a_callbacks_changes_are_restored_as_the_declared_types() -> None:
    live = Booking(date(2024, 1, 1))

    def change(ctx: Booking) -> None:
        ctx.day, ctx.seats, ctx.loose = date(2024, 5, 6), (3, 4), {"a": 1}
        ctx.notes.append("window")  # changed in place

    recorded = _changed(live, change)
    assert recorded == {"set": {"day": "2024-05-06", "seats": [3, 4], "notes": ["window"],
                                "loose": {"a": 1}}}
    handoffs.restore(live, recorded)  # where the callback just ran: nothing to do
    assert live.seats == (3, 4)
    fresh = Booking(date(2024, 1, 1))
    handoffs.restore(fresh, recorded)
    assert fresh == live and isinstance(fresh.day, date) and isinstance(fresh.seats, tuple)

    profile = Profile(name="ada")
    recorded = _changed(profile, lambda p: setattr(p, "since", date(2020, 2, 2)))
    again = Profile(name="ada")
    handoffs.restore(again, recorded)
    assert again.since == date(2020, 2, 2)


def test_a_mapping_context_is_restored_key_by_key() -> None:
    recorded = _changed({"keep": 1, "drop": 2}, lambda d: (d.pop("drop"), d.update(new=[1])))
    assert recorded == {"set": {"new": [1]}, "unset": ["drop"]}
    fresh = {"keep": 1, "drop": 2}
    handoffs.restore(fresh, recorded)
    assert fresh == {"keep": 1, "new": [1]}
    assert _changed({"keep": 1}, lambda d: None) is None  # nothing changed: nothing recorded


def test_a_change_that_cannot_be_recorded_fails_naming_it() -> None:
    """A value JSON cannot carry would be lost after a crash: the step says so instead."""
    with pytest.raises(TypeError, match="'loose'"):
        _changed(Booking(date(2024, 1, 1)), lambda b: setattr(b, "loose", object()))
    with pytest.raises(TypeError, match="replaced the run's context"):
        handoffs.changes("transfer", {}, Booking(date(2024, 1, 1)), Booking(date(2024, 1, 1)))
