"""The call a run was left with when a worker takes it again (``open_call``): sent when it
never was, sent again at once when it has no effect, else resolved with its tool's
``lookup`` once its deadline has passed; and the end of a run-scoped cancel
(``finish_cancel``). Functions of the step context, as ``workers.decisions``' are.
"""

from __future__ import annotations

from durable import clock
from durable.agents import Agent
from durable.controls.cancellation import finish_specs
from durable.flow import budgets
from durable.log import events as ev
from durable.log import keys
from durable.log.state import Action
from durable.log.store import RunHandle, Spec, now_ms
from durable.outcomes import LOOKUP_RETRY_MS, resolve_unknown

from . import authority, family
from .context import StepContext
from .decisions import over_limit, run_tool
from .turns import BLOCKING, Offload, Slot

#: Longest a worker waits in place for an earlier dispatch's deadline before a lookup.
MAX_INLINE_WAIT_S = 30.0


def _no_outcome(act: Action) -> Spec:
    """An effect-free call sent as often as its tool allows, with no outcome: it fails."""
    return Spec(ev.ActionFailed, {"step": act.step, "key": act.key, "error_type": "NoOutcome",
                                  "error": f"no outcome after {act.attempts} attempts "
                                           f"(last: {act.unknown_reason or 'lost'})"})


async def open_call(ctx: StepContext, handle: RunHandle, agent: Agent, act: Action,
                    slot: Slot, pending: list[Spec]) -> tuple[bool, int]:
    """The open call ``act`` of a run taken again: sent when it never was (or was found
    not applied); else the earlier attempt may have applied the effect: sent again at once
    when it has none, else resolved with ``lookup`` once its deadline has passed."""
    state = handle.state
    if act.status in ("decided", "not_applied"):
        if state.cancel is not None:  # a call-scoped cancel: this call never starts
            await ctx.commit(handle, pending, [Spec(ev.CallCanceled, {
                "step": act.step, "key": act.key, "reason": state.cancel.reason})])
            return False, 0
        tool = ctx.registry.tool(act.tool)
        asked = await authority.approval(ctx, handle, tool, act, pending)
        if asked is not None:
            return asked
        args = handle.live_args.get(act.step, act.args)
        if tool.effect_free and act.attempts >= tool.attempts_for(args):  # resent enough
            await ctx.commit(handle, pending, [_no_outcome(act)])
            return False, 0
        why = budgets.resend_exhausted(state, tool.model, act.attempts)
        if why is not None:  # each model request sent counts, resends too
            await ctx.commit(handle, pending, [Spec(ev.Failed, {
                "error": f"{budgets.REASON}: {why}", "reason": budgets.REASON})])
            await ctx.io.stat("budgets_exhausted")
            return True, 0
        deadline = now_ms() + int(tool.timeout_for(args) * 1000)
        if await over_limit(ctx, handle, agent, [(tool, act.step, args)], deadline,
                            pending, []):
            return True, 0
        await ctx.commit(handle, pending, [Spec(ev.ActionDispatched, {
            "step": act.step, "key": act.key, "deadline": deadline})],
            ledger=[("p", act.key, f"claimed|{deadline}")], dispatch=True)
        return await run_tool(ctx, handle, tool, act, slot, pending)
    # dispatched or unknown: the earlier attempt may have applied the effect.
    tool = ctx.registry.tool(act.tool)
    if tool.effect_free:  # nothing outside changed: send it again at once...
        if act.attempts >= tool.attempts_for(handle.live_args.get(act.step, act.args)):
            specs = [_no_outcome(act)]  # ...but not forever
        else:
            specs = [Spec(ev.ActionReconciled, {"step": act.step, "key": act.key,
                                                "resolution": "not_applied",
                                                "by": "effect_free"})]
            await ctx.io.stat("effect_free_resent")
        pending[:] = specs
        ctx.log.stage(handle, specs)
        return False, 0
    wait_s = (act.deadline + ctx.settings.worker.clock_skew_ms) / 1000 - clock.time()
    if wait_s > MAX_INLINE_WAIT_S:
        if handle.staged:
            await ctx.commit(handle, pending, [])
        return True, 0

    def wait_and_ask() -> list[Spec] | None:
        with ctx.outside():
            if wait_s > 0 and slot.token.wait(wait_s):
                return None  # a cancel or a lost lease: look at the run again
            return resolve_unknown(ctx.redis, tool, act, handle.run_id)

    specs = await Offload(BLOCKING, wait_and_ask)
    if specs is None:
        return False, 0
    if not specs:  # the lookup itself failed: the reconciler asks again shortly
        if handle.staged:
            await ctx.commit(handle, pending, [])
        await ctx.io.look_again_at(handle.run_id, now_ms() + LOOKUP_RETRY_MS)
        return True, 0
    pending[:] = specs
    ctx.log.stage(handle, specs)
    if handle.state.waiting:
        await ctx.commit(handle, pending, [], checkpoint=True)
        return True, 0
    return False, 0


async def finish_cancel(ctx: StepContext, handle: RunHandle, pending: list[Spec]) -> None:
    """End a run-scoped cancel: the open call's fate and ``canceled`` recorded, then the
    run's live children asked to cancel too."""
    cancel = handle.state.cancel
    assert cancel is not None
    specs = finish_specs(handle.state, cancel.reason, cancel.requested_ts)
    await ctx.commit(handle, pending, specs)
    await ctx.io.hset(keys.CANCEL_LATENCY, handle.run_id, specs[-1].fields["latency_ms"])
    await family.cancel_children(ctx.io, ctx.log, handle.state, cancel.reason,
                                 ctx.worker_id, ctx.settings.cancel.secret)
