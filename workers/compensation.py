"""A cancel with compensation, as the step loop drives it (``durable.controls.compensation``
says what it is and what it promises).

Each pass does one thing, then the loop looks at the run again:

- an open call of the agent's own is stopped as a cancel stops it: never sent when it was
  not (``call_canceled``), else resolved with its ``lookup`` once its deadline has passed
  (``open_calls.open_call``), so that only effects known to be applied are compensated;
- an open compensation is sent (after its approval, when its tool requires one) or, when
  an earlier attempt may have applied it, resolved with ``lookup_compensation``;
- otherwise the newest applied effect not compensated yet gets its compensation: its
  intent (``undoes``: the step), the claim of its key ``<key>:undo`` and its dispatch are
  recorded in one commit, then the tool's ``compensate`` is called with the key and the
  deadline, and its outcome recorded like any call's;
- when none is left, the run ends ``canceled`` with the steps compensated and those that
  could not be undone.

The crash windows are the step loop's (``workers.hooks``), at the compensation's own step.
A compensation is sent after the cancel request, so its dispatch is not flagged as one
(``append.lua`` refuses a flagged dispatch while a cancel is pending): it is the cancel's
own authorized work, which ``verify`` tells apart by its ``undoes``.
"""

from __future__ import annotations

import threading
from typing import Any

from durable.agents import Agent, Tool, ToolContext
from durable.agents.cancel_token import CancelToken
from durable.controls.compensation import read_plan, read_whole, summary_specs, undo_key
from durable.errors import Claimed
from durable.leases import Lease
from durable.log import events as ev
from durable.log import keys
from durable.log.state import Action
from durable.log.store import RunHandle, Spec, now_ms

from . import authority, decisions, family, open_calls
from .context import StepContext
from .turns import Offload, Slot


async def advance(ctx: StepContext, handle: RunHandle, agent: Agent, slot: Slot,
                  pending: list[Spec]) -> tuple[bool, int]:
    """One pass of a cancel with compensation (see the module doc): (stop, steps taken)."""
    state = handle.state
    cancel = state.cancel
    assert cancel is not None
    for act in state.open_actions:
        if act.undoes:
            return await open_undo(ctx, handle, agent, act, slot, pending)
        if act.status in ("decided", "not_applied"):
            await ctx.commit(handle, pending, [Spec(ev.CallCanceled, {
                "step": act.step, "key": act.key, "reason": cancel.reason})])
            return False, 0
        return await open_calls.open_call(ctx, handle, agent, act, slot, pending)
    if handle.staged:  # the plan is read from the log: what is staged goes there first
        await ctx.commit(handle, pending, [])
    run_id = handle.run_id
    plan = await ctx.io.elsewhere(lambda: read_plan(ctx.log, run_id, ctx.registry))
    if not plan.todo:
        specs = summary_specs(handle.state, plan)
        await ctx.commit(handle, pending, specs)
        await ctx.io.hset(keys.CANCEL_LATENCY, run_id, specs[-1].fields["latency_ms"])
        await family.cancel_children(ctx.io, ctx.log, handle.state, cancel.reason,
                                     ctx.worker_id, ctx.settings.cancel.secret)
        return True, 0
    target = plan.todo[0]
    tool = ctx.registry.tool(target.tool)
    step, key = state.step + 1, undo_key(target.key)
    decided = Spec(ev.StepDecided, {"step": step, "tool": tool.name, "args": target.args,
                                    "key": key, "undoes": target.step})
    if tool.requires_approval:  # the same gate as any call of the tool
        ctx.log.stage(handle, [decided])
        await authority.approval(ctx, handle, tool, handle.state.actions[step], pending)
        return True, 1
    deadline = now_ms() + int(tool.timeout_for(target.args) * 1000)
    try:
        await ctx.commit(handle, pending, [decided, Spec(ev.ActionDispatched, {
            "step": step, "key": key, "deadline": deadline})],
            ledger=[("c", key, f"claimed|{deadline}")])
    except Claimed as exc:
        return await decisions.claimed(ctx, handle, _lease(handle), exc)
    ctx.hooks.after_intent(run_id, step)
    return await send(ctx, handle, tool, handle.state.actions[step], slot, pending,
                      target.result)


async def open_undo(ctx: StepContext, handle: RunHandle, agent: Agent, act: Action,
                    slot: Slot, pending: list[Spec]) -> tuple[bool, int]:
    """A compensation taken again: sent when it never was (or was found not applied), once
    approved; else resolved with ``lookup_compensation`` (``open_calls.open_call``)."""
    if act.status not in ("decided", "not_applied"):
        return await open_calls.open_call(ctx, handle, agent, act, slot, pending)
    tool = ctx.registry.tool(act.tool)
    asked = await authority.approval(ctx, handle, tool, act, pending)
    if asked is not None:
        return asked
    run_id = handle.run_id
    whole = await ctx.io.elsewhere(lambda: read_whole(ctx.log, run_id))
    outcome = whole.actions[act.undoes].result
    deadline = now_ms() + int(tool.timeout_for(act.args) * 1000)
    await ctx.commit(handle, pending, [Spec(ev.ActionDispatched, {
        "step": act.step, "key": act.key, "deadline": deadline})],
        ledger=[("p", act.key, f"claimed|{deadline}")])
    return await send(ctx, handle, tool, handle.state.actions[act.step], slot, pending,
                      outcome)


async def send(ctx: StepContext, handle: RunHandle, tool: Tool, act: Action, slot: Slot,
               pending: list[Spec], outcome: Any) -> tuple[bool, int]:
    """Call ``tool.compensate`` for ``act`` (its intent and dispatch are in the log) and
    record what it observed.

    It is given a token of its own: the run's was cancelled by the very request this
    compensation carries out. A lost lease still stops it where it matters: its outcome
    is refused by the fencing, and the next holder looks it up."""
    run_id = handle.run_id
    token = CancelToken()

    def effect(args: dict[str, Any], tctx: ToolContext) -> Any:
        return tool.compensate(args, outcome, tctx)

    def call() -> list[Spec]:
        with ctx.outside():
            slot.thread_id, slot.in_call = threading.get_ident(), True
            try:
                return ctx.dispatcher.dispatch(run_id, tool, act, token, act.args, effect)
            finally:
                slot.in_call = False

    specs = await Offload(act.tool, call)
    ctx.hooks.after_effect(run_id, act.step)
    return await decisions.outcomes(ctx, handle, slot, pending, specs, 1)


def _lease(handle: RunHandle) -> Lease:
    return Lease(handle.run_id, handle.lease or "|-1")
