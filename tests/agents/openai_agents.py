"""OpenAI Agents SDK agents run as durable runs, for the tests (worker processes import this
module through ``DURABLE_AGENTS``). Their models are the SDK's own
``OpenAIChatCompletionsModel`` against the local server of ``tests.servers.openai``
(``TEST_OPENAI_URL``), resolved by name through a model provider.

The tools write their effects into ``tests.agents.basic``' SQLite table (one row per application,
keyed by the step's idempotency key, no unique key when ``TEST_DB_DEDUPE=0``): an effect
applied twice shows.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

from agents import Agent, RunContextWrapper, function_tool, handoff
from agents.mcp import MCPServerStdio
from agents.models.interface import Model, ModelProvider
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from openai import AsyncOpenAI

from durable.agents import OutcomeUnknown
from durable.integrations.openai_agents import DurableAgent, StepOptions, step_context
from tests.servers.integration_world import (
    book_lookup,
    mcp_apply_lookup,
    mcp_server_command,
    refund_lookup,
)
from tests.servers.integration_world import effect as _effect


class LocalProvider(ModelProvider):
    """Every model name is the local server's scripted model (the client made on first use,
    in the process that sends the requests)."""

    def get_model(self, model_name: str | None) -> Model:
        client = AsyncOpenAI(base_url=os.environ["TEST_OPENAI_URL"], api_key="test",
                             max_retries=0)
        return OpenAIChatCompletionsModel(model=model_name or "scripted", openai_client=client)






# A triage agent hands off to a booker, which books two slots (the second reply also leaves a
# note: two tool calls at once), then answers from what the tools returned.


@function_tool
def book(slot: int) -> dict[str, Any]:
    """Book a slot (an effect in the outside world)."""
    return _effect(f"slot {slot}")


@function_tool
async def note(text: str) -> str:
    """Leave a note (effect-free, async)."""
    return f"noted {text} ({step_context().key})"


booker = Agent(name="booker", instructions="booker: book the slots asked for.",
               model="scripted", tools=[book, note])
triage = Agent(name="triage", instructions="triage: route the request.", model="scripted",
               handoffs=[booker])

durable_booker = DurableAgent(triage, name="oai_booker", model_provider=LocalProvider(), tools={
    "book": StepOptions(timeout_s=2.0, lookup=book_lookup),
    "note": StepOptions(effect_free=True),
}, budgets={"model_calls": 10})


# A refund agent: its tool needs approval (the SDK's ``needs_approval=True``), decided by an
# approver with the role "finance"; the model reports what happened.


@function_tool(needs_approval=True)
def refund(order: str, cents: int) -> dict[str, Any]:
    """Refund an order (needs a human's approval)."""
    return _effect(f"refund {order} {cents}")


refunder = Agent(name="refunder", instructions="refunder: refund what is asked.",
                 model="scripted", tools=[refund])

durable_refunder = DurableAgent(refunder, name="oai_refunder", model_provider=LocalProvider(),
                                tools={"refund": StepOptions(timeout_s=2.0, lookup=refund_lookup,
                                                             approver_role="finance")})


# A counter: one tool turn per count, past the SDK's default of 10 turns.


@function_tool
def tick(n: int) -> str:
    """Count one."""
    return f"tick {n}"


def _counter(turns: int) -> Agent[Any]:
    return Agent(name="counter", instructions=f"counter {turns}", model="scripted",
                 tools=[tick])


durable_counter = DurableAgent(_counter(15), name="oai_counter", model_provider=LocalProvider(),
                               tools={"tick": StepOptions(effect_free=True)}, stream=False)
durable_short = DurableAgent(_counter(15), name="oai_short", model_provider=LocalProvider(),
                             tools={"tick": StepOptions(effect_free=True)},
                             budgets={"model_calls": 4})
# Streamed (the default), with a "tokens" budget: 10 tokens a reply, so the fourth reply
# ends it.
durable_tokens = DurableAgent(_counter(15), name="oai_tokens", model_provider=LocalProvider(),
                              tools={"tick": StepOptions(effect_free=True)},
                              budgets={"tokens": 35})


# A storyteller whose one reply streams forty words to the run's followers.

durable_storyteller = DurableAgent(
    Agent(name="storyteller", instructions="storyteller: tell a story.", model="scripted"),
    name="oai_storyteller", model_provider=LocalProvider())


# A manager that asks the storyteller through a child tool: the story is a child run.

durable_manager = DurableAgent(
    Agent(name="manager", instructions="manager: delegate the story.", model="scripted",
          tools=[durable_storyteller.as_child_tool("tell_story")]),
    name="oai_manager", model_provider=LocalProvider())

# A counter whose SDK turn limit comes before its end: the SDK's MaxTurnsExceeded.

durable_turns = DurableAgent(_counter(15), name="oai_turns", model_provider=LocalProvider(),
                             tools={"tick": StepOptions(effect_free=True)}, max_turns=3)


# A conversation continued in a new run from the items the last one returned.

durable_chat = DurableAgent(
    Agent(name="storyteller", instructions="storyteller: tell a story.", model="scripted"),
    name="oai_chat", model_provider=LocalProvider(), return_items=True, stream=False)


# Refunds that need an approval above 100 cents only (a callable ``needs_approval``).


async def _large(ctx: Any, params: dict[str, Any], call_id: str) -> bool:
    return bool(params.get("cents", 0) > 100)


@function_tool(needs_approval=_large)
def small_refund(order: str, cents: int) -> dict[str, Any]:
    """Refund an order (a human approves those above 100 cents)."""
    return _effect(f"refund {order} {cents}")


durable_small_refunder = DurableAgent(
    Agent(name="small_refunder", instructions="small_refunder: refund.", model="scripted",
          tools=[small_refund]),
    name="oai_small_refunder", model_provider=LocalProvider(),
    tools={"small_refund": StepOptions(timeout_s=2.0, lookup=refund_lookup,
                                       approver_role="finance")})


# A booking whose reply is lost after the effect (``OutcomeUnknown``): resolved by lookup,
# never told to the model as a failure it would retry under a new key.


@function_tool
def lossy_book(slot: int) -> dict[str, Any]:
    """Book a slot; the reply is lost after the booking was applied."""
    _effect(f"slot {slot}")
    raise OutcomeUnknown("the booking service's reply was lost")


durable_lossy = DurableAgent(
    Agent(name="lossy", instructions="lossy: book.", model="scripted", tools=[lossy_book]),
    name="oai_lossy", model_provider=LocalProvider(),
    tools={"lossy_book": StepOptions(timeout_s=1.0, lookup=book_lookup)})


# An agent whose tools are a real MCP stdio server's (``tests.servers.mcp``): ``apply`` (an
# effect, keyed by the call's ``_meta``) MCP_APPLIES times, one per reply, then ``peek``.

MCP_APPLIES = 6


def _ledger() -> MCPServerStdio:
    command, args, env, cwd = mcp_server_command()
    return MCPServerStdio(name="ledger", params={"command": command, "args": args, "env": env,
                                                 "cwd": cwd}, client_session_timeout_seconds=30)


durable_mcp = DurableAgent(
    Agent(name="applier", instructions=f"mcp_applier {MCP_APPLIES}", model="scripted",
          mcp_servers=[_ledger()]),
    name="oai_mcp", model_provider=LocalProvider(),
    tools={"ledger.*": StepOptions(timeout_s=5.0, lookup=mcp_apply_lookup)})


# A gate agent hands the traveler off to boarding; the handoff's ``on_handoff`` picks a seat
# at random (an effect, then a change to the run's context), and boarding's tool boards the
# traveler on the seat the context holds (it fails without one).


@dataclass
class Seat:
    number: str


@dataclass
class Trip:
    traveler: str
    seat: Seat | None = None


def assign_seat(ctx: RunContextWrapper[Trip]) -> None:
    _effect(f"seat for {ctx.context.traveler}")
    ctx.context.seat = Seat(f"{random.randint(1, 40)}{random.choice('ABCDEF')}")


@function_tool
def board(ctx: RunContextWrapper[Trip]) -> dict[str, Any]:
    """Board the traveler on the seat the gate assigned."""
    seat = ctx.context.seat
    if not isinstance(seat, Seat):
        raise LookupError(f"no seat was assigned to {ctx.context.traveler} (got {seat!r})")
    return _effect(f"{ctx.context.traveler} in {seat.number}")


boarding = Agent[Trip](name="boarding", instructions="boarding: board the traveler.",
                       model="scripted", tools=[board])
gate = Agent[Trip](name="gate", instructions="gate: hand over to boarding.", model="scripted",
                   handoffs=[handoff(boarding, on_handoff=assign_seat)])

durable_gate = DurableAgent(gate, name="oai_gate", model_provider=LocalProvider(),
                            context=lambda inp: Trip(traveler="ada"),
                            tools={"board": StepOptions(timeout_s=2.0)})
