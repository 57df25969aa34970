"""More pydantic-ai agents run as durable runs, for the tests (imported by the workers
through ``DURABLE_AGENTS``): a long run past pydantic-ai's default of 50 requests, a tool that
cancels its run, and an agent whose tools are a real MCP stdio server's (``tests.servers.mcp``).
Models are ``FunctionModel``s counting their requests per idempotency key (``TEST_MODEL_LOG``).
"""

from __future__ import annotations

import os
from typing import Any

from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import DynamicToolset

from durable.agents import Lookup
from durable.integrations.pydantic_ai import DurableAgent, RedisDurability, StepOptions
from tests.agents.pydantic_ai import _count_request, _done, _reply, _returns
from tests.servers.integration_world import applied as _applied
from tests.servers.integration_world import mcp_apply_lookup, mcp_server_command

#: Tool calls the long agent makes, one per model reply: 100 model requests in all.
LONG_CALLS = 99


async def long_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _count_request()
    if os.environ.get("TEST_BIG_REPLY"):  # a reply over DURABLE_MAX_RESULT_BYTES
        return _reply(TextPart("x" * 4096))
    done = len(_returns(messages))
    if done < LONG_CALLS:
        return _reply(ToolCallPart("tick", {"n": done + 1}))
    return _reply(TextPart(f"ticked {done}"))


def _ticked(key: str, args: dict[str, Any]) -> Lookup:
    return Lookup.applied({"done": f"tick {args['n']}", "key": key}) if _applied(key) \
        else Lookup.not_applied()


long_durability = RedisDurability(tools={"tick": StepOptions(timeout_s=5.0, lookup=_ticked)})
long_agent = Agent(FunctionModel(long_model), name="pai_long", capabilities=[long_durability])


@long_agent.tool_plain
def tick(n: int) -> dict[str, Any]:
    """Count (an effect, keyed: a tick applied twice would show)."""
    from tests.servers.integration_world import effect as _effect

    return _effect(f"tick {n}")


long_durability.register()


# A tool that asks pydantic-ai to cancel its own run (``RunContext.cancel()``).


async def quitting_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _count_request()
    if not _returns(messages):
        return _reply(ToolCallPart("give_up", {}))
    return _reply(TextPart("went on"))


quitter = Agent(FunctionModel(quitting_model), name="pai_quitter",
                capabilities=[RedisDurability(tools={"give_up": StepOptions(step=False)})])


@quitter.tool
def give_up(ctx: RunContext[None]) -> str:
    """Stop the whole run."""
    ctx.cancel()
    return "stopping"


DurableAgent(quitter)  # registered with the capability it carries


# An agent whose tools are an MCP server's: ``apply`` (an effect, keyed) 20 times, one per
# reply, then ``peek`` (read-only), then the answer.

MCP_CALLS = 20


def _server() -> MCPToolset[Any]:
    command, args, env, cwd = mcp_server_command()
    return MCPToolset(StdioTransport(command=command, args=args, env=env, cwd=cwd), id="ledger")


async def mcp_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _count_request()
    names = sorted(t.name for t in info.function_tools)
    assert names == ["apply", "peek"], names
    done = _returns(messages)
    if len(done) < MCP_CALLS:
        return _reply(ToolCallPart("apply", {"n": len(done) + 1}))
    if len(done) == MCP_CALLS:
        return _reply(ToolCallPart("peek", {}))
    return _reply(TextPart(f"applied {MCP_CALLS}, peeked {done[-1].content}"))


mcp_durability = RedisDurability(tools={
    "ledger.*": StepOptions(timeout_s=5.0, lookup=mcp_apply_lookup)})
mcp_agent = Agent(FunctionModel(mcp_model), name="pai_mcp", toolsets=[_server()],
                  capabilities=[mcp_durability])
mcp_durability.register()


# An agent on a real OpenAI-compatible server (the world's scripted model, over HTTP, through
# pydantic-ai's OpenAI model): ``notify`` then ``write``, each an effect keyed in ``TEST_DB``.


def _openai_model() -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    base = os.environ.get("DURABLE_MODEL_BASE_URL", "http://127.0.0.1:9/v1")
    return OpenAIChatModel(os.environ.get("DURABLE_MODEL_NAME", "scripted"),
                           provider=OpenAIProvider(base_url=base, api_key="unused"))


def _notified(key: str, args: dict[str, Any]) -> Lookup:
    return Lookup.applied({"notification_id": 1, "key": key}) if _applied(key) \
        else Lookup.not_applied()


def _written(key: str, args: dict[str, Any]) -> Lookup:
    return Lookup.applied({"report_id": 2, "key": key}) if _applied(key) \
        else Lookup.not_applied()


openai_durability = RedisDurability(stream=os.environ.get("TEST_PAI_STREAM") == "1", tools={
    "notify": StepOptions(timeout_s=5.0, lookup=_notified),
    "write": StepOptions(timeout_s=5.0, lookup=_written)})
openai_agent = Agent(_openai_model(), name="pai_openai", capabilities=[openai_durability])


@openai_agent.tool_plain
def notify(recipient: str, message: str) -> dict[str, Any]:
    """Notify someone (an effect)."""
    from tests.servers.integration_world import effect as _effect

    return {"notification_id": 1, "key": _effect(f"notify {recipient}")["key"]}


@openai_agent.tool_plain
def write(source: str, summary: dict[str, Any]) -> dict[str, Any]:
    """Write a report (an effect)."""
    from tests.servers.integration_world import effect as _effect

    return {"report_id": 2, "key": _effect(f"report {source}")["key"]}


openai_durability.register()


# A dynamic toolset (``@agent.toolset``): its tools exist only once the run builds them.


async def dynamic_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _count_request()
    done = _returns(messages)
    if not done:
        return _reply(ToolCallPart("stamp", {"label": "a"}), ToolCallPart("stamp",
                                                                          {"label": "b"}))
    return _reply(TextPart("stamped " + ", ".join(str(_done(p)) for p in done)))


def _stamps(ctx: RunContext[None]) -> Any:
    from pydantic_ai import FunctionToolset

    from tests.servers.integration_world import effect as _effect

    def stamp(label: str) -> dict[str, Any]:
        """Stamp a label (an effect)."""
        return _effect(f"stamp {label}")

    return FunctionToolset([stamp])


# Given when the agent is built, as pydantic-ai's durability base asks (it refuses a toolset
# ``@agent.toolset`` adds afterwards).
dynamic_durability = RedisDurability(tools={"stamps.*": StepOptions(timeout_s=5.0)})
dynamic_agent = Agent(FunctionModel(dynamic_model), name="pai_dynamic",
                      toolsets=[DynamicToolset(_stamps, id="stamps")],
                      capabilities=[dynamic_durability])
dynamic_durability.register()


# An agent with its own event-stream handler, which counts every event it sees per run in
# ``TEST_EVENTS`` (SQLite): a handler shown the same event twice would show.


def _count_events(run_id: str, kinds: list[str]) -> None:
    import sqlite3

    conn = sqlite3.connect(os.environ["TEST_EVENTS"], timeout=10, isolation_level=None)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS events (run TEXT, n INTEGER, kinds TEXT)")
        conn.execute("INSERT INTO events VALUES (?, ?, ?)", (run_id, len(kinds), ",".join(kinds)))
    finally:
        conn.close()


async def _handler(ctx: RunContext[None], events: Any) -> None:
    """Counts each event as it is shown (one row per event): an event shown before a crash
    counts even when the stream it came in never ended."""
    async for event in events:
        _count_events(str(ctx.run_id), [event.event_kind])


def _stream_script(messages: list[ModelMessage]) -> list[Any]:
    from pydantic_ai.models.function import DeltaToolCall

    done = len(_returns(messages))
    if done < 2:
        return [{0: DeltaToolCall(name="book_it", json_args=f'{{"slot": {done + 1}}}')}]
    return ["booked ", "both"]


async def streamed_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise AssertionError("this model only streams")


async def streamed_chunks(messages: list[ModelMessage], info: AgentInfo) -> Any:
    _count_request()
    for chunk in _stream_script(messages):
        yield chunk


def _booked(key: str, args: dict[str, Any]) -> Lookup:
    return Lookup.applied({"done": f"slot {args['slot']}", "key": key}) if _applied(key) \
        else Lookup.not_applied()


handled_durability = RedisDurability(event_stream_handler=_handler, tools={
    "book_it": StepOptions(timeout_s=5.0, lookup=_booked)})
handled_agent = Agent(FunctionModel(streamed_model, stream_function=streamed_chunks),
                      name="pai_handled", capabilities=[handled_durability])


@handled_agent.tool_plain
def book_it(slot: int) -> dict[str, Any]:
    """Book a slot (an effect)."""
    from tests.servers.integration_world import effect as _effect

    return _effect(f"slot {slot}")


handled_durability.register()


# A long conversation of effect-free lookups (``tests.test_pydantic_ai_cost``): ``CHAT_CALLS``
# model requests, each reply some text and a tool call until the last, each tool result ~0.3 KB.

CHAT_CALLS = 100
_SAID = "a reply says something beside its tool call, as real ones do. " * 4


async def chatty_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = len(_returns(messages))
    if done < CHAT_CALLS - 1:
        return _reply(TextPart(_SAID), ToolCallPart("look_up", {"n": done + 1}))
    return _reply(TextPart(f"looked up {done} times"))


chat_durability = RedisDurability(tools={"look_up": StepOptions(effect_free=True)})
chat_agent = Agent(FunctionModel(chatty_model), name="pai_chat", capabilities=[chat_durability])


@chat_agent.tool_plain
async def look_up(n: int) -> dict[str, Any]:
    """Look something up (effect-free)."""
    return {"n": n, "found": _SAID[:200]}


chat_durability.register()
