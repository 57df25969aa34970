"""pydantic-ai agents run as durable runs, for the tests (worker processes import this module
through ``DURABLE_AGENTS``). The models are pydantic-ai ``FunctionModel``s: no network.

Two real external counters, SQLite files: ``TEST_MODEL_LOG`` gets one row per model request
(the step's idempotency key), ``TEST_DB`` one row per tool effect (``tests.agents.basic``' table,
with no unique key when ``TEST_DB_DEDUPE=0``): a request or an effect sent twice shows.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.capabilities import Capability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import RunContext
from pydantic_ai.usage import RequestUsage

from durable.agents import Lookup
from durable.integrations.pydantic_ai import DurableAgent, StepOptions, step_context
from tests.servers.integration_world import applied, book_lookup, refund_lookup
from tests.servers.integration_world import effect as _effect


def _count_request() -> None:
    path = os.environ.get("TEST_MODEL_LOG")
    if path:
        conn = sqlite3.connect(path, timeout=10, isolation_level=None)
        conn.execute("CREATE TABLE IF NOT EXISTS requests (key TEXT, at REAL)")
        conn.execute("INSERT INTO requests VALUES (?, ?)", (step_context().key, time.time()))
        conn.close()


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts
            if isinstance(p, ToolReturnPart)]


def _done(part: ToolReturnPart) -> Any:
    """What a tool reported done: its return is a dict (an effect's, ``_effect``)."""
    assert isinstance(part.content, dict), part.content
    return part.content["done"]


def _reply(*parts: Any) -> ModelResponse:
    return ModelResponse(parts=list(parts), usage=RequestUsage(input_tokens=7, output_tokens=3))






# A booking agent: two model turns that each book a slot (the second also leaves a note, two
# tool calls in one response), then a final answer built from what the tools returned.


async def booking_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _count_request()
    await asyncio.sleep(float(os.environ.get("TEST_MODEL_SLOW_S", "0")))  # a slow model
    done = _returns(messages)
    if len(done) == 0:
        return _reply(ToolCallPart("book", {"slot": 1}))
    if len(done) == 1:
        return _reply(ToolCallPart("book", {"slot": 2}), ToolCallPart("note", {"text": "two"}))
    return _reply(TextPart("booked: " + ", ".join(
        str(p.content["done"]) for p in done if isinstance(p.content, dict))))


booker = Agent(FunctionModel(booking_model), name="pai_booker",
               instructions="Book the slots you are asked for.")


@booker.tool_plain
def book(slot: int) -> dict[str, Any]:
    """Book a slot (an effect in the outside world)."""
    return _effect(f"slot {slot}")


@booker.tool_plain
async def note(text: str) -> str:
    """Leave a note (effect-free, async)."""
    return f"noted {text} ({step_context().key})"


durable_booker = DurableAgent(booker, tools={
    "book": StepOptions(timeout_s=2.0, lookup=book_lookup),
    "note": StepOptions(effect_free=True),
}, budgets={"model_calls": 10})


# A refund agent: its tool requires approval (pydantic-ai's ``requires_approval=True``),
# decided by an approver with the role "finance"; the model reports what happened.


async def refund_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _count_request()
    done = _returns(messages)
    if not done:
        return _reply(ToolCallPart("refund", {"order": "A1", "cents": 500}))
    if done[0].outcome == "denied":
        return _reply(TextPart(f"not refunded: {done[0].content}"))
    return _reply(TextPart(f"refunded: {_done(done[0])}"))


refunder = Agent(FunctionModel(refund_model), name="pai_refunder")


@refunder.tool(requires_approval=True)
def refund(ctx: RunContext[object], order: str, cents: int) -> dict[str, Any]:
    """Refund an order (needs a human's approval)."""
    assert ctx.tool_call_approved  # approved by this system's approver
    return _effect(f"refund {order} {cents}")


durable_refunder = DurableAgent(refunder, tools={
    "refund": StepOptions(timeout_s=2.0, lookup=refund_lookup, approver_role="finance")})


# A tool a capability contributes (``Capability(tools=..., id="stamps")``, which pydantic-ai
# hands the agent wrapped in a ``CapabilityOwnedToolset``): a step like the agent's own.


async def stamping_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _count_request()
    done = _returns(messages)
    if not done:
        return _reply(ToolCallPart("stamp", {"label": "a"}))
    return _reply(TextPart(f"stamped: {_done(done[0])}"))


def stamp(label: str) -> dict[str, Any]:
    """Stamp a label (an effect in the outside world)."""
    return _effect(f"stamp {label}")


def _stamped(key: str, args: dict[str, Any]) -> Lookup:
    return Lookup.applied({"done": f"stamp {args['label']}", "key": key}) if applied(key) \
        else Lookup.not_applied()


stamper = Agent(FunctionModel(stamping_model), name="pai_stamper",
                capabilities=[Capability(tools=[stamp], id="stamps")])
durable_stamper = DurableAgent(stamper, tools={
    "stamps.stamp": StepOptions(timeout_s=5.0, lookup=_stamped)})
