"""Parallel steps: several calls decided at once (``Parallel``, a list of ``Call`` from
``decide()``, ``ctx.parallel`` or ``asyncio.gather`` in a code agent).

Each call is a step of its own, numbered in the order the agent gave them, with its own
key, deadline, outcome, lookup and cancel signal (the run's token interrupts them all).
Their intents, dispatches and ledger claims are recorded in one script call; then they run
at once, each on a thread of its own, and each outcome is recorded as it arrives (by the
thread that observed it). A worker killed meanwhile leaves the others dispatched: the next
one resolves each as any open step (lookup after its deadline, or sent again at once when
effect-free), in step order, before the agent decides again. Every call counts against the
budgets.

What a group may not hold, refused with a clear error before anything is recorded: more
calls than the agent's ``max_parallel`` (or ``DURABLE_ACTION_WINDOW``), a tool the agent
does not name, arguments over the payload limit, a tool that requires an approval.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec

from durable.agents import Agent, Call, Parallel, Registry, Tool
from durable.agents.configuration import model_used
from durable.call_identity import digest_placeholder
from durable.errors import UnknownTool
from durable.log import events as ev
from durable.log.keys import CHILD_TOOL
from durable.log.state import Action, RunState
from durable.log.store import Spec, now_ms

from .steps import plain, step_key, values_field


@dataclass
class Group:
    """A checked group: its steps, tools and the arguments the tools get."""

    steps: list[int]
    tools: list[Tool]
    args: list[Any]


def check_group(agent: Agent, registry: Registry, state: RunState, decision: Parallel,
                max_payload: int, window: int) -> Group:
    """The group ``decision`` would be from ``state``; raises ``ValueError`` (or
    ``UnknownTool``) with what makes it impossible."""
    calls: Sequence[Call] = decision.calls
    first = state.step + 1
    steps = list(range(first, first + len(calls)))
    if not calls:
        raise ValueError("a parallel decision with no call")
    limit = min(agent.max_parallel, window)
    if len(calls) > limit:
        raise ValueError(f"{len(calls)} calls at once, the limit is {limit} (the agent's "
                         f"max_parallel, {agent.max_parallel}, and DURABLE_ACTION_WINDOW, "
                         f"{window})")
    if decision.steps and decision.steps != steps:
        raise ValueError(f"the agent numbered its calls {decision.steps}, the log is at "
                         f"step {state.step}")
    tools, args = [], []
    for call in calls:
        if not isinstance(call, Call):
            raise TypeError(f"a parallel decision holds {type(call).__name__}, not Call")
        if call.tool not in agent.tools and call.tool != CHILD_TOOL:
            raise UnknownTool(call.tool)
        tool = registry.tool(call.tool)
        if tool.requires_approval:
            raise ValueError(f"{tool.name} requires an approval: it cannot run in parallel "
                             "with other calls; call it alone")
        value = plain(call.args)
        if tool.log_args == "full" and len(msgspec.msgpack.encode(value)) > max_payload:
            raise ValueError(f"arguments of {call.tool} exceed {max_payload} bytes")
        tools.append(tool)
        args.append(value)
    return Group(steps, tools, args)


def exhausted(state: RunState, group: Group) -> str | None:
    """Why the group may not be taken under the run's budgets (each call counts)."""
    limits = state.budgets
    n, models = len(group.steps), sum(t.model for t in group.tools)
    if "steps" in limits and state.step + n > limits["steps"]:
        return f"{state.step} steps taken and {n} more asked at once, the limit is " \
               f"{limits['steps']}"
    if models and "model_calls" in limits and \
            state.model_calls + models > limits["model_calls"]:
        return f"{state.model_calls} model calls made and {models} more asked at once, " \
               f"the limit is {limits['model_calls']}"
    if "tokens" in limits and state.tokens >= limits["tokens"]:
        return f"{state.tokens} tokens used, the limit is {limits['tokens']}"
    return None


def intents(run_id: str, group: Group, values: list[Any],
            config: dict[str, str] | None = None) -> list[Spec]:
    """The ``step_decided`` events of the group (the values drawn go with its first; a
    model step names the pin of ``config`` it runs under)."""
    first = group.steps[0]
    used = model_used(config or {})
    return [Spec(ev.StepDecided, {
        "step": step, "tool": tool.name, "key": step_key(run_id, step), "model": tool.model,
        "context": tool.context,
        "args": digest_placeholder(args) if tool.log_args == "digest" else args,
        "group": first, **values_field(values if step == first else []),
        **({"ran_under": used} if used and tool.model else {})})
        for step, tool, args in zip(group.steps, group.tools, group.args, strict=True)]


def dispatches(run_id: str, group: Group) -> tuple[list[Spec], list[tuple[str, str, str]]]:
    """The ``action_dispatched`` events of the group and the ledger claims of its keys."""
    specs, ledger = [], []
    for step, tool, args in zip(group.steps, group.tools, group.args, strict=True):
        key = step_key(run_id, step)
        deadline = now_ms() + int(tool.timeout_for(args) * 1000)
        specs.append(Spec(ev.ActionDispatched, {"step": step, "key": key,
                                                "deadline": deadline}))
        ledger.append(("c", key, f"claimed|{deadline}"))
    return specs, ledger


def run_at_once(calls: Sequence[tuple[Tool, Action]],
                one: Callable[[Tool, Action], list[Spec]]) -> list[list[Spec]]:
    """``one(tool, act)`` for every call at once, each on a thread of its own in the
    caller's context (its run's slot, its trace); their outcomes in step order."""
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="step") as pool:
        futures = [pool.submit(contextvars.copy_context().run, one, tool, act)
                   for tool, act in calls]
        return [f.result() for f in futures]
