"""A counterfactual fork's calls, as the worker takes them (``durable.audit.forks``): a
call the parent made identically at the same step reuses the parent's outcome, a tool that
simulates answers a held effect, and any other effect is left to the approval gate, which
holds it until an operator releases it (``workers.gates.gate``). Nothing here sends."""

from __future__ import annotations

from typing import Any

from durable.agents import Tool
from durable.audit.forks import choice, outcome_spec, parent_actions
from durable.log.store import RunHandle, Spec

from .context import StepContext


async def counterfactual(ctx: StepContext, handle: RunHandle, tool: Tool, step: int,
                         args: Any, decided: Spec, pending: list[Spec]
                         ) -> tuple[bool, int] | None:
    """The call of ``step`` in a fork that holds effects: its intent and a reused or
    simulated outcome committed at once (the loop goes on), or None: send it, or hold it
    (``held``: the gate asks for a release)."""
    state = handle.state
    parent = await ctx.io.elsewhere(lambda: parent_actions(ctx.log, state.parent))
    what, result, reused = await ctx.user(f"{tool.name}'s simulation",
                                          lambda: choice(state, tool, step, args, parent))
    if what in ("send", "hold"):
        return None
    await ctx.commit(handle, pending, [decided, outcome_spec(step, str(decided.fields["key"]),
                                                             what, result, reused)])
    await ctx.io.stat("fork_reused" if what == "reuse" else "fork_simulated")
    return False, 1
