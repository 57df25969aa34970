"""What a worker checks against the approver registry before it acts on a decision: a
rejection or an operator's settle already in the log must have been signed by someone with
the right to make it (else the run is quarantined, never fed to the agent), and a call
whose tool requires an approval is sent only once a valid one is recorded (else one is
asked for, and the run waits). The registry's entries carry an admin signature
(``durable.controls.approvers``), so a Redis writer without the admin key cannot grant these rights.
"""

from __future__ import annotations

import logging

from durable.agents import Tool
from durable.controls.approvals import check_history, check_recorded
from durable.controls.settling import unsigned_settle
from durable.log.state import Action
from durable.log.store import RunHandle, Spec, now_ms
from durable.outcomes import LOOKUP_RETRY_MS

from .context import StepContext
from .gates import Check, gate, request_specs

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
