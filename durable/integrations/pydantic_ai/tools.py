"""A toolset's tool calls inside a durable run: the function's side (a wrapper toolset whose
``call_tool`` takes the step of its tool, for a function toolset and a dynamic one), the
worker's side (the step tool that calls the toolset's tool, and asks its ``lookup`` after a
crash), and the JSON a call's outcome is recorded as (its return, or the control-flow signal
it raised). An MCP toolset's steps are ``durable.integrations.pydantic_ai.mcp``."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from pydantic import TypeAdapter
from pydantic_ai import ApprovalRequired, CallDeferred, ModelRetry, ToolFailed
from pydantic_ai.messages import ToolReturn, ToolReturnContent
from pydantic_ai.tools import RunContext, ToolDenied
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset

from durable.agents import Lookup, Tool, ToolContext
from durable.code import StepFailed
from durable.integrations.base import (
    StepOptions,
    make_step,
    opaque,
    recorded_lookup,
    run_in_step,
    stable,
)
from durable.integrations.pydantic_ai.model import retryable_but_not_usage
from durable.integrations.pydantic_ai.run import Durability, bound

# The JSON of a tool step --------------------------------------------------------------------


CONTENT: TypeAdapter[Any] = TypeAdapter(ToolReturnContent)
TOOL_RETURN: TypeAdapter[ToolReturn[Any]] = TypeAdapter(ToolReturn)


def encode_return(value: Any) -> dict[str, Any]:
    if isinstance(value, ToolReturn):
        return {"tool_return": TOOL_RETURN.dump_python(value, mode="json")}
    return {"return": CONTENT.dump_python(value, mode="json", fallback=opaque)}


async def tool_outcome(call: Awaitable[Any]) -> dict[str, Any]:
    """A tool call's outcome as JSON: its return, or the control-flow signal it raised
    (pydantic-ai's tools ask for a retry, fail or defer by raising)."""
    try:
        value = await call
    except ModelRetry as exc:
        return {"retry": exc.message}
    except ToolFailed as exc:
        return {"failed": exc.message}
    except ApprovalRequired as exc:
        return {"approval_required": stable(exc.metadata)}
    except CallDeferred as exc:
        return {"deferred": stable(exc.metadata), "kind": exc.kind}
    return encode_return(value)


def decode_outcome(data: Any) -> Any:
    if not isinstance(data, dict):
        raise TypeError(f"a tool step recorded {data!r}")
    if "return" in data:
        return CONTENT.validate_python(data["return"])
    if "tool_return" in data:
        return TOOL_RETURN.validate_python(data["tool_return"])
    if "retry" in data:
        raise ModelRetry(data["retry"])
    if "failed" in data:
        raise ToolFailed(data["failed"])
    if "approval_required" in data:
        raise ApprovalRequired(data["approval_required"])
    if "deferred" in data:
        raise CallDeferred(data["deferred"], kind=data.get("kind", "external"))
    raise TypeError(f"a tool step recorded {data!r}")


# The steps of a function or dynamic toolset -------------------------------------------------


@dataclass
class ToolCall:
    """The live call a tool step makes: handed from the function to the step tool."""

    toolset: AbstractToolset[Any]
    name: str
    args: dict[str, Any]
    ctx: RunContext[Any]
    tool: ToolsetTool[Any]


def original_name(name: str, tool: ToolsetTool[Any]) -> str:
    """The tool's name in its own toolset (a prefixing or renaming wrapper changes it)."""
    original = getattr(tool, "original_name", None)
    return original if isinstance(original, str) and original else name


async def take_step(owner: Durability, step: str, toolset: AbstractToolset[Any],
                    name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                    tool: ToolsetTool[Any], step_args: dict[str, Any] | None = None) -> Any:
    """A tool call as the step ``step`` (its arguments ``step_args``, by default the
    tool's): its outcome from the log, or from the call."""
    b = bound(owner)
    assert b is not None
    args = stable(tool_args if step_args is None else step_args)
    try:
        outcome = await b.step(step, args, ToolCall(toolset, name, tool_args, ctx, tool),
                               call_id=ctx.tool_call_id)
    except StepFailed as exc:
        if exc.status == "rejected":
            return ToolDenied(f"The tool call was denied: {exc.error}.")
        raise
    return decode_outcome(outcome)


@dataclass
class DurableFunctionToolset(WrapperToolset[Any]):
    """A function toolset inside a durable run: ``call_tool`` is the step of its tool."""

    owner: Durability | None = None
    #: Tool name (as the toolset holds it) -> step tool name; a tool not here is not a step.
    steps: dict[str, str] = field(default_factory=dict)
    #: Tools whose approval this system asks for (pydantic-ai is told they need none).
    approved_here: frozenset[str] = frozenset()

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await super().get_tools(ctx)
        if not self.approved_here or self.owner is None or bound(self.owner) is None:
            return tools
        out: dict[str, ToolsetTool[Any]] = {}
        for name, tool in tools.items():
            if original_name(name, tool) in self.approved_here:
                # Approved by this system, in a step of its own: a parallel group cannot wait
                # for an approval, so the call runs alone (pydantic-ai's barrier).
                kind = "function" if tool.tool_def.kind == "unapproved" else tool.tool_def.kind
                tool = replace(tool, tool_def=replace(tool.tool_def, kind=kind, sequential=True))
            out[name] = tool
        return out

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        owner = self.owner
        if owner is None or bound(owner) is None:
            return await super().call_tool(name, tool_args, ctx, tool)
        original = original_name(name, tool)
        step = self.steps.get(original)
        if step is None:
            if original in owner.not_steps:
                return await super().call_tool(name, tool_args, ctx, tool)
            raise LookupError(f"tool {original!r} was not in its toolset when the durable "
                              f"agent {owner.name!r} was registered")
        return await take_step(owner, step, self.wrapped, name, tool_args, ctx, tool)


class ToolStep(Tool):
    """``<name>.tool.<tool>``: one call of a pydantic-ai tool, by its own toolset."""

    owner: ClassVar[Durability]
    options: ClassVar[StepOptions]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        call = self.owner.handed(ctx, self.name, args, ToolCall)
        run_ctx = call.ctx
        if self.requires_approval:  # approved by this system: the tool may know it
            run_ctx = replace(run_ctx, tool_call_approved=True)

        async def invoke() -> dict[str, Any]:
            return await tool_outcome(
                call.toolset.call_tool(call.name, call.args, run_ctx, call.tool))

        return await run_in_step(invoke, ctx)

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup | Awaitable[Lookup]:
        return recorded_lookup(self.options.lookup, key, args, encode_return)


def tool_step(owner: Durability, step: str, opts: StepOptions, needs_approval: bool) -> Tool:
    """The step tool ``step`` of one pydantic-ai tool, with its options."""
    return make_step(ToolStep, step, **{
        **opts.step_attrs(), "retryable": retryable_but_not_usage(opts.retryable),
        "requires_approval": needs_approval, "owner": owner})


@dataclass
class DurableDynamicToolset(WrapperToolset[Any]):
    """A dynamic toolset (``@agent.toolset``) inside a durable run: its tools are known only
    once the run builds them, so each call is the one step ``<name>.tool.<id>.call`` of the
    toolset, with the tool's name and arguments as its arguments."""

    owner: Durability | None = None
    step: str = ""

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        owner = self.owner
        if owner is None or bound(owner) is None:
            return await super().call_tool(name, tool_args, ctx, tool)
        return await take_step(owner, self.step, self.wrapped, name, tool_args, ctx, tool,
                               step_args={"tool": name, "args": tool_args})
