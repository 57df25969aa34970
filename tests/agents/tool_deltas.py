"""Agents whose model streams tool calls, for ``tests.test_tool_call_streaming`` (worker
processes import this module through ``DURABLE_AGENTS``): a code agent whose built-in
``chat`` step streams against ``tests.servers.openai`` (``DURABLE_MODEL_BASE_URL``), and a
pydantic-ai agent whose ``FunctionModel`` streams one tool call in pieces, then its answer."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from durable.code import RunContext, agent
from durable.integrations.pydantic_ai import RedisDurability, StepOptions
from durable.models import chat
from tests.agents.pydantic_ai import _returns
from tests.servers.integration_world import book_lookup, effect

#: The pieces of the pydantic-ai model's one tool call's arguments, as it streams them.
ARGS_PIECES = ('{"sl', 'ot": ', "7}")


class Ask(BaseModel):
    system: str = "booker: book the slots asked for."


@agent(input_model=Ask, tools=("chat",))
def chat_caller(ctx: RunContext, inp: Ask) -> Any:
    """One streamed ``chat`` step; returns the tool calls the model made."""
    reply = chat(ctx, [{"role": "system", "content": inp.system},
                       {"role": "user", "content": "book one"}], stream=True)
    return [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls]


async def _unstreamed(messages: list[ModelMessage], info: AgentInfo) -> Any:
    raise AssertionError("this model only streams")


async def _stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
    if _returns(messages):
        yield "booked"
        return
    yield {0: DeltaToolCall(name="book", tool_call_id="call_book_7")}
    for piece in ARGS_PIECES:
        yield {0: DeltaToolCall(json_args=piece)}


streamer_durability = RedisDurability(stream=True, tools={
    "book": StepOptions(timeout_s=5.0, lookup=book_lookup)})
streamer = Agent(FunctionModel(_unstreamed, stream_function=_stream), name="pai_streamer",
                 capabilities=[streamer_durability])


@streamer.tool_plain
def book(slot: int) -> dict[str, Any]:
    """Book a slot (an effect)."""
    return effect(f"slot {slot}")


streamer_durability.register()
