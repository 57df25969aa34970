"""The step tools of a durable pydantic-ai agent: the worker's side of each operation
(``backend``), which runs the body the function handed over, and the set of them an agent
registers, one per tool of its toolsets (each with its ``StepOptions``: timeout, lookup,
approval...) and one per kind of operation of its model, MCP servers and event handler.

Every step tool awaits the live body with ``run_in_step``, so the code it reaches (a tool, a
model, an MCP call) reads its step with ``step_context()``; a model step's record carries
its usage (``compat.recorded``), a tool step's ``lookup`` is its ``StepOptions``' answer in
the form the step records (``compat.tool_return``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic_ai.exceptions import UsageLimitExceeded, UserError
from pydantic_ai.toolsets import (
    AbstractToolset,
    DynamicToolset,
    FunctionToolset,
    WrapperToolset,
)
from pydantic_ai.toolsets.abstract import AGENT_TOOLSET_ID
from pydantic_ai.toolsets.external import ExternalToolset

from durable.agents import Lookup, OutcomeUnknown, Tool, ToolContext
from durable.integrations.base import (
    EffectFreeStep,
    ModelStepBase,
    StepOptions,
    make_step,
    recorded_lookup,
    run_in_step,
)
from durable.integrations.mcp_sessions import connection_lost
from durable.integrations.pydantic_ai import compat
from durable.integrations.pydantic_ai.backend import Live, StepNamer
from durable.integrations.pydantic_ai.run import Shared

try:
    from pydantic_ai.mcp import MCPToolset
except ImportError:  # pragma: no cover - pydantic-ai without its MCP extra
    MCPToolset = None  # type: ignore[assignment,misc]

__all__ = ["AgentSteps", "agent_steps", "is_mcp", "leaves", "retryable_but_not_usage"]

#: pydantic-ai's errors that no retry can fix (the peers never retry them either).
NOT_RETRYABLE: tuple[type[BaseException], ...] = (UserError, UsageLimitExceeded)


class _RetryableMeta(type):
    """``isinstance(exc, cls)``: one of ``cls.named``, and not one of ``NOT_RETRYABLE``."""

    named: tuple[type[BaseException], ...]

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls.named) and not isinstance(obj, NOT_RETRYABLE)


def retryable_but_not_usage(named: tuple[type[BaseException], ...]) \
        -> tuple[type[BaseException], ...]:
    """The errors a step retries: those named, less pydantic-ai's non-retryable ones (a
    broad ``Exception`` would otherwise send again a request pydantic-ai refused itself)."""
    if not named:
        return ()
    marker = _RetryableMeta("Retryable", (Exception,), {"named": tuple(named)})
    return (marker,)  # type: ignore[return-value]  # a class of Exception, by its metaclass


# The step tools -----------------------------------------------------------------------------


async def _perform(tool: Tool, owner: Shared, args: dict[str, Any], ctx: ToolContext) -> Any:
    live = owner.handed(ctx, tool.name, args, Live)
    return compat.recorded(live.operation_id, await run_in_step(live.body, ctx))


class OperationStep(EffectFreeStep):
    """An operation without external effect (an event shown to the handler, a toolset's
    tools or instructions, a count of tokens...): sent again after a crash. So is a
    capability's ``@durable_operation`` (at least once, as pydantic-ai's engines run their
    units: it makes its own effects idempotent, with ``step_context().key``)."""

    owner: ClassVar[Shared]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await _perform(self, self.owner, args, ctx)


class ModelOperationStep(ModelStepBase):
    """``<name>.model`` (and ``.compact``): a model request, counted against the
    "model_calls" budget, its usage against "tokens", its arguments logged as a digest."""

    owner: ClassVar[Shared]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await _perform(self, self.owner, args, ctx)


class ToolCallStep(Tool):
    """One call of a tool (``<name>.tool.<tool>``...), resolved after a crash by the
    ``lookup`` of its ``StepOptions``."""

    owner: ClassVar[Shared]
    options: ClassVar[StepOptions]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await _perform(self, self.owner, args, ctx)

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup | Awaitable[Lookup]:
        return recorded_lookup(self.options.lookup, key, args, compat.tool_return)


class McpCallStep(ToolCallStep):
    """``<name>.mcp.<id>.call`` / ``.read``: a call of an MCP server's tool. A call whose
    connection closed under it may have reached the server: its outcome is unknown."""

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        try:
            return await _perform(self, self.owner, args, ctx)
        except Exception as exc:
            if not self.effect_free and connection_lost(exc):
                raise OutcomeUnknown(f"the MCP server's connection closed: {exc!r}") from exc
            raise


# The step tools of an agent -----------------------------------------------------------------


def is_mcp(toolset: AbstractToolset[Any]) -> bool:
    return MCPToolset is not None and isinstance(toolset, MCPToolset)


def leaves(toolsets: Sequence[AbstractToolset[Any]]) -> list[AbstractToolset[Any]]:
    """The leaf toolsets of ``toolsets``, each once (the same instance in two places is one
    toolset), the ones whose calls become steps. pydantic-ai's ``apply`` visits leaves, and
    also a wrapper that visits itself before its wrapped toolset (``CapabilityOwnedToolset``,
    around each toolset a capability contributes): one whose leaves are all visited too is
    passed over."""
    visited: list[AbstractToolset[Any]] = []
    for toolset in toolsets:
        toolset.apply(visited.append)
    out: list[AbstractToolset[Any]] = []
    for toolset in visited:
        if any(toolset is seen for seen in out):
            continue
        if isinstance(toolset, WrapperToolset):
            inner: list[AbstractToolset[Any]] = []
            toolset.wrapped.apply(inner.append)
            if all(any(leaf is v for v in visited) for leaf in inner):
                continue
        out.append(toolset)
    return out


@dataclass
class AgentSteps:
    """The step tools of an agent, and what its capability reads of them while it runs."""

    tools: list[Tool] = field(default_factory=list)
    #: (toolset id, tool name) of the tools that are not steps (``StepOptions(step=False)``).
    not_steps: set[tuple[str, str]] = field(default_factory=set)
    #: Tool names (as the model calls them) whose approval this system asks for.
    approved_here: set[str] = field(default_factory=set)
    #: Tool names pydantic-ai is told need no approval (``requires_approval=False``).
    approved_anyway: set[str] = field(default_factory=set)
    #: The MCP toolsets, by id.
    mcp: dict[str, AbstractToolset[Any]] = field(default_factory=dict)


def agent_steps(name: str, owner: Shared, toolsets: Sequence[AbstractToolset[Any]],
                options: Mapping[str, StepOptions], model_timeout_s: float,
                model_retryable: tuple[type[BaseException], ...]) -> AgentSteps:
    """Every step tool of the agent ``name`` (refused, with nothing registered, on a
    toolset this system cannot make durable, one without an id, two under one id, or options
    for a tool the agent does not have)."""
    namer = StepNamer(name)
    out = AgentSteps()
    shared = {"owner": owner}
    model = {**shared, "timeout_s": model_timeout_s,
             "retryable": retryable_but_not_usage(model_retryable)}
    out.tools += [make_step(ModelOperationStep, f"{name}.model", **model),
                  make_step(ModelOperationStep, f"{name}.model.compact", **model),
                  make_step(OperationStep, f"{name}.model.count_tokens", **model),
                  make_step(OperationStep, f"{name}.model.cancel_suspended", **model),
                  make_step(OperationStep, f"{name}.events", **shared),
                  make_step(OperationStep, f"{name}.capability", **shared)]
    used: set[str] = set()
    ids: dict[str, AbstractToolset[Any]] = {}
    for leaf in leaves(toolsets):
        if isinstance(leaf, ExternalToolset):
            continue  # its calls are deferred to the caller, never run here
        ident = leaf.id
        if not ident:
            raise ValueError(f"durable agent {name!r}: {leaf.label} needs an id "
                             "(FunctionToolset(..., id=...), or the capability's when a "
                             "capability contributes it: Capability(tools=..., id=...)): "
                             "its steps are named after it")
        if ident in ids:
            raise ValueError(f"durable agent {name!r}: two toolsets have the id {ident!r}; "
                             "their tools' steps would share names")
        ids[ident] = leaf
        if isinstance(leaf, FunctionToolset):
            _function_steps(owner, namer, leaf, ident, options, used, out)
        elif is_mcp(leaf) or isinstance(leaf, DynamicToolset):
            used.add(f"{ident}.*")
            opts = options.get(f"{ident}.*", StepOptions())
            attrs = {**shared, **opts.step_attrs(), "options": opts,
                     "retryable": retryable_but_not_usage(opts.retryable)}
            if is_mcp(leaf):
                out.mcp[ident] = leaf
                base = f"{name}.mcp.{ident}"
                out.tools += [
                    make_step(OperationStep, f"{base}.tools", **shared),
                    make_step(OperationStep, f"{base}.instructions", **shared),
                    make_step(McpCallStep, f"{base}.call", **attrs),
                    make_step(McpCallStep, f"{base}.read", **{
                        **attrs, "effect_free": True, "cancellable": True})]
            else:
                base = f"{name}.tool.{ident}"
                out.tools += [make_step(OperationStep, f"{base}.tools", **shared),
                              make_step(OperationStep, f"{base}.validate", **shared),
                              make_step(ToolCallStep, f"{base}.call", **{
                                  **attrs, "requires_approval": bool(opts.requires_approval)})]
        else:
            raise TypeError(f"durable agent {name!r}: {leaf.label} cannot be made durable "
                            "(function, dynamic and MCP toolsets can)")
    unknown = sorted(set(options) - used)
    if unknown:
        raise ValueError(f"durable agent {name!r}: options for unknown tools {unknown}")
    return out


def _function_steps(owner: Shared, namer: StepNamer, toolset: FunctionToolset[Any], ident: str,
                    options: Mapping[str, StepOptions], used: set[str],
                    out: AgentSteps) -> None:
    scope = "" if ident == AGENT_TOOLSET_ID else f"{ident}."
    prefix = namer.tool_prefix(ident)
    for tool_name, tool in toolset.tools.items():
        opts = options.get(scope + tool_name, StepOptions())
        used.add(scope + tool_name)
        if not opts.step:
            out.not_steps.add((ident, tool_name))
            continue
        needs = tool.requires_approval if opts.requires_approval is None \
            else opts.requires_approval
        if needs:
            out.approved_here.add(tool_name)
        elif tool.requires_approval:
            out.approved_anyway.add(tool_name)
        attrs = {"owner": owner, **opts.step_attrs(), "options": opts,
                 "retryable": retryable_but_not_usage(opts.retryable),
                 "requires_approval": bool(needs)}
        out.tools += [make_step(ToolCallStep, prefix + tool_name, **attrs),
                      make_step(OperationStep, f"{prefix}{tool_name}.validate", owner=owner)]
