"""What a worker checks against the approver registry before it acts on a decision: a
rejection or an operator's settle already in the log must have been signed by someone with
the right to make it (else the run is quarantined, never fed to the agent), and a call
whose tool requires an approval is sent only once a valid one is recorded (else one is
asked for, and the run waits). In a counterfactual fork that holds effects
(``durable.audit.forks``) every effect passes the same gate: a call the parent made
identically at the same step reuses its outcome, a tool that simulates answers, and any
other effect waits for a release (signed, as an approval) before it is sent. The
registry's entries carry an admin signature (``durable.controls.approvers``), so a Redis
writer without the admin key cannot grant these rights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from durable.agents import Tool
from durable.audit.forks import choice, held, outcome_spec, parent_actions
from durable.controls.approvals import check_history, check_recorded
from durable.controls.settling import unsigned_settle
from durable.log.state import Action
from durable.log.store import RunHandle, Spec, now_ms
from durable.outcomes import LOOKUP_RETRY_MS

from .context import StepContext
from .gates import Check, gate, request_specs
from .parallel import Group
from .steps import step_key

log = logging.getLogger("durable.worker")


async def unsigned_rejection(ctx: StepContext, handle: RunHandle) -> str | None:
    """A rejection or an operator's settle the fold already applied must have been
    valid when it was made; one that was not (written around the client) is never fed
    to the agent: the run is quarantined. Approvals are checked at the gate.

    Checked against the approver registry on a thread of its own, when there is anything
    to check (most runs have neither)."""
    state = handle.state
    if any(a.decision not in (None, "approve") for a in state.approvals.values()) or \
            any(act.settle is not None for act in state.actions.values()):
        return await ctx.io.elsewhere(lambda: _unsigned_rejection(ctx, handle))
    return None


def _unsigned_rejection(ctx: StepContext, handle: RunHandle) -> str | None:
    for appr in handle.state.approvals.values():
        if appr.decision is not None and appr.decision != "approve":
            problem = check_history(ctx.approvers, handle.run_id, appr)
            if problem is not None:
                return f"the rejection of {appr.request} does not hold: {problem}"
    return unsigned_settle(ctx.approvers, ctx.settings.security.settle_role, handle.state)


def approval_check(ctx: StepContext, run_id: str) -> Check:
    """How this worker checks a recorded decision: against the approver registry, now."""
    return lambda appr: check_recorded(ctx.approvers, run_id, appr)


async def approval(ctx: StepContext, handle: RunHandle, tool: Tool, act: Action,
                   pending: list[Spec]) -> tuple[bool, int] | None:
    """None when ``act`` may be dispatched now; else ask for an approval and stop.

    The digest needs the tool's facts, read now: if they cannot be read, the intent is
    kept and the run is looked at again shortly.
    """
    def facts() -> list[Spec] | None:
        verdict, reason = gate(handle.state, tool, act,
                               approval_check(ctx, handle.run_id))
        return None if verdict == "go" else request_specs(handle.state, tool, act, reason)

    try:
        specs = await ctx.user(f"{tool.name}'s approval facts", facts)
        if specs is None:
            return None
    except Exception as exc:
        log.warning("run %s: approval facts of %s unavailable: %r", handle.run_id,
                    tool.name, exc)
        if handle.staged:
            await ctx.commit(handle, pending, [])
        await ctx.io.look_again_at(handle.run_id, now_ms() + LOOKUP_RETRY_MS)
        return True, 0
    await ctx.commit(handle, pending, specs, checkpoint=True)
    return True, 0


async def counterfactual(ctx: StepContext, handle: RunHandle, tool: Tool, step: int,
                         args: Any, decided: Spec, pending: list[Spec]
                         ) -> tuple[bool, int] | None:
    """The call of ``step`` in a fork that holds effects: its intent and a reused or
    simulated outcome committed at once (the loop goes on), or None: send it, or hold it
    (``held``: the gate asks for a release)."""
    state = handle.state
    if not held(state, tool) and not (tool.model and state.reuse_replies):
        return None  # a request or a read, sent: nothing of the parent's to read
    parent = await ctx.io.elsewhere(lambda: parent_actions(ctx.log, state.parent))
    what, result, reused = await ctx.user(f"{tool.name}'s simulation",
                                          lambda: choice(state, tool, step, args, parent))
    if what in ("send", "hold"):
        return None
    await ctx.commit(handle, pending, [decided, outcome_spec(step, str(decided.fields["key"]),
                                                             what, result, reused)])
    await ctx.io.stat("fork_reused" if what == "reuse" else "fork_simulated")
    return False, 1


@dataclass
class GroupPlan:
    """What a held fork does with a parallel decision: ``done`` (the job's answer) when
    nothing is left to send, else the reused or simulated outcomes and the calls to send."""

    done: tuple[bool, int] | None = None
    reused: list[Spec] = field(default_factory=list)
    group: Group | None = None


async def counterfactual_group(ctx: StepContext, handle: RunHandle, group: Group,
                               decided: list[Spec], pending: list[Spec]) -> GroupPlan:
    """A parallel decision in a fork that holds effects: each call reused, simulated or
    sent (effect-free); one that would be held quarantines the fork, nothing written (a
    release is of one call, and the calls of a group go out together)."""
    state = handle.state
    parent = await ctx.io.elsewhere(lambda: parent_actions(ctx.log, state.parent))
    reused: list[Spec] = []
    send: list[int] = []
    for i, (step, tool, args) in enumerate(zip(group.steps, group.tools, group.args,
                                               strict=True)):
        what, result, key = await ctx.user(f"{tool.name}'s simulation",
                                           partial(choice, state, tool, step, args, parent))
        if what == "hold":
            await ctx.commit(handle, pending, [])
            await ctx.quarantine(handle, f"steps from {group.steps[0]}: {tool.name} (step "
                                 f"{step}) would be held, in a parallel decision; a fork "
                                 "that holds effects releases them one call at a time")
            return GroupPlan(done=(True, 0))
        if what == "send":
            send.append(i)
        else:
            reused.append(outcome_spec(step, step_key(handle.run_id, step), what, result, key))
    if not send:
        await ctx.commit(handle, pending, [*decided, *reused])
        return GroupPlan(done=(False, len(group.steps)))
    return GroupPlan(reused=reused, group=Group([group.steps[i] for i in send],
                                                [group.tools[i] for i in send],
                                                [group.args[i] for i in send]))
