"""A ``DurableAgent`` as a tool of another one, run as a child run (``durable.controls.children``):
``triage = Agent(..., tools=[research.as_child_tool()])``.

The SDK's own ``agent.as_tool()`` runs the other agent inside the tool call, one step of the
caller's run. A child tool instead starts the other ``DurableAgent`` as a run of its own
(its id derived from the caller's run and step, so a caller executed again starts it once),
with its own log, steps, budgets and followers; the caller waits for it holding no worker,
and the child's final output is the tool's result. A child that fails, is canceled or
expires is told to the model as the tool's result.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Protocol

from agents import Agent, Runner
from agents.tool import FunctionTool
from agents.tool_context import ToolContext as SdkToolContext

from durable.code.steps import ChildFailed
from durable.integrations.base import jsonable
from durable.integrations.openai_agents.binding import bound

#: The attribute of a child tool naming the ``DurableAgent`` it runs.
MARK = "_durable_child"

SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["input"],
    "properties": {"input": {"type": "string", "description": "What the agent is asked."}}}


class ChildAgent(Protocol):
    """What a child tool knows of the ``DurableAgent`` it runs (and of its caller)."""

    @property
    def name(self) -> str: ...

    @property
    def root(self) -> Agent[Any]: ...

    @property
    def max_turns(self) -> int: ...


def child_tool(agent: ChildAgent, name: str | None, description: str | None) -> FunctionTool:
    """The tool a caller's agent lists; outside a durable run it runs the agent directly."""

    async def direct(tctx: SdkToolContext[Any], arguments: str) -> Any:
        result = await Runner.run(agent.root, _input(arguments), max_turns=agent.max_turns)
        return jsonable(result.final_output)

    tool = FunctionTool(
        name=name or agent.name, params_json_schema=SCHEMA, on_invoke_tool=direct,
        description=description or f"Ask the agent {agent.name!r} and get its final answer.")
    setattr(tool, MARK, agent)
    return tool


def durable_child(caller: ChildAgent, tool: FunctionTool, child: ChildAgent) -> FunctionTool:
    """``tool`` inside ``caller``'s durable run: its call starts ``child`` as a child run."""

    async def invoke(tctx: SdkToolContext[Any], arguments: str) -> Any:
        b = bound(caller)
        if b is None:
            return await tool.on_invoke_tool(tctx, arguments)
        try:
            return await b.child(child.name, {"input": _input(arguments)})
        except ChildFailed as exc:
            return f"The agent {child.name!r} did not answer: run {exc.child} {exc.status}: " \
                   f"{exc.error}"

    return dataclasses.replace(tool, on_invoke_tool=invoke)


def _input(arguments: str) -> str:
    try:
        parsed = json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments
    return str(parsed.get("input", "")) if isinstance(parsed, dict) else str(parsed)
