"""What the step loop does with a decision (``workers.loop``): a call is recorded and
sent, a group of calls sent at once (``workers.parallel``), a wait entered, an approval
asked for (``workers.authority``); the outcomes staged for the next commit. A call a run
was left with when it is taken again is ``workers.open_calls``'s.

Functions of the step context they are given (``workers.context.StepContext``: the loop
as its helpers see it), coroutines like the loop's own: every Redis call awaited
(``StepContext.io``), every call of user code too (``StepContext.user``, ``Offload``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import msgspec
import redis

from durable.agents import (
    Agent,
    Cancel,
    Fail,
    Finish,
    Parallel,
    Tool,
    Wait,
)
from durable.agents.cancel_token import CancelToken
from durable.audit.forks import held
from durable.call_identity import digest_placeholder, is_placeholder
from durable.code import CodeAgent
from durable.controls.cancellation import finish_specs
from durable.errors import (
    CancelPending,
    Claimed,
    ConflictError,
    LeaseLost,
    Terminal,
    UnknownTool,
)
from durable.flow import budgets
from durable.leases import Lease
from durable.log import counters
from durable.log import events as ev
from durable.log.keys import CHILD_TOOL
from durable.log.state import Action
from durable.log.store import RunHandle, Spec, now_ms
from durable.telemetry import tracing

from . import aio, authority, family, parallel
from .context import StepContext
from .steps import agent_traceback, finished, plain, ran_under, step_key, values_field
from .turns import BLOCKING, Offload, Slot

log = logging.getLogger("durable.worker")

async def decide(ctx: StepContext, handle: RunHandle, agent: Agent, slot: Slot,
                 pending: list[Spec], lease: Lease) -> tuple[bool, int]:
    """The agent decides the next step; what it decided is recorded (and sent)."""
    state = handle.state
    try:
        decision = await aio.next_decision(ctx, agent, state)
    except Exception as exc:  # an agent bug: keep the evidence, quarantine
        await ctx.commit(handle, pending, [])
        where = agent.name if isinstance(agent, CodeAgent) else f"{agent.name}.decide"
        await ctx.quarantine(handle, f"agent {where} raised {exc!r}",
                             traceback=agent_traceback(exc))
        return True, 0
    if isinstance(decision, Finish):
        await ctx.commit(handle, pending, [finished(decision.result, ctx.log.limits)])
        ctx.hooks.after_outcome(handle.run_id, state.step)
        return True, 0
    if isinstance(decision, Fail):
        await ctx.commit(handle, pending, [Spec(ev.Failed, {"error": decision.error,
                                                            "reason": decision.reason})])
        return True, 0
    if isinstance(decision, Cancel):  # the agent asked to stop: a cancel, recorded whole
        asked, undo = now_ms(), decision.compensate  # with compensation: by the next passes
        await ctx.commit(handle, pending, [
            Spec(ev.CancelRequested, {"reason": decision.reason, "requested_ts": asked,
                                      "by": agent.name, **({"compensate": True} if undo else {})}),
            *([] if undo else finish_specs(state, decision.reason, asked))])
        if undo:
            return False, 0
        await family.cancel_children(ctx.io, ctx.log, handle.state, decision.reason,
                                     ctx.worker_id, ctx.settings.cancel.secret)
        return True, 0
    if isinstance(decision, list):  # a decide() agent's calls at once
        decision = Parallel(list(decision))
    if isinstance(decision, Parallel):
        return await decide_group(ctx, handle, agent, slot, pending, lease, decision)
    if isinstance(decision, Wait):
        until = now_ms() + int(decision.timeout_s * 1000)
        await ctx.commit(handle, pending, [Spec(ev.WaitEntered, {
            "kind": decision.kind, "reason": decision.reason, "until": until,
            "request": f"{handle.run_id}:w{state.version + 1}", "data": decision.data,
            **values_field(decision.values)})], checkpoint=True)
        if decision.kind == "child":  # the child may have ended already
            child = await family.child_state(ctx.io, ctx.log, str(decision.data["child"]))
            if child is not None:
                await ctx.woke(await family.wake_parent(ctx.io, ctx.log, child,
                                                        ctx.worker_id))
        return True, 0
    try:
        if decision.tool not in agent.tools and decision.tool != CHILD_TOOL:
            raise UnknownTool(decision.tool)
        tool = ctx.registry.tool(decision.tool)
        args = plain(decision.args)
        if tool.log_args == "full" and \
                len(msgspec.msgpack.encode(args)) > ctx.settings.payloads.max_payload_bytes:
            raise ValueError(f"arguments of {decision.tool} exceed "
                             f"{ctx.settings.payloads.max_payload_bytes} bytes")
    except (UnknownTool, ValueError, TypeError) as exc:
        await ctx.commit(handle, pending, [])
        await ctx.quarantine(handle, f"step {state.step + 1}: {exc}")
        return True, 0
    why = budgets.exhausted(state, tool.model)
    if why is not None:
        await ctx.commit(handle, pending, [Spec(ev.Failed, {
            "error": f"{budgets.REASON}: {why}", "reason": budgets.REASON})])
        await ctx.io.stat("budgets_exhausted")
        return True, 0
    step = state.step + 1
    key = step_key(handle.run_id, step)
    recorded = digest_placeholder(args) if tool.log_args == "digest" else args
    handle.live_args[step] = args
    decided = Spec(ev.StepDecided, {"step": step, "tool": tool.name, "args": recorded,
                                    "key": key, "model": tool.model, "context": tool.context,
                                    **values_field(decision.values),
                                    **ran_under(state, tool.model)})
    if state.cancel is not None:  # call-scoped cancel pending: record, never send
        await ctx.commit(handle, pending, [decided, Spec(ev.CallCanceled, {
            "step": step, "key": key, "reason": state.cancel.reason})])
        return False, 1
    if state.hold_effects:  # a counterfactual fork: reuse, simulate, or hold it
        done = await authority.counterfactual(ctx, handle, tool, step, args, decided, pending)
        if done is not None:
            return done
    if tool.requires_approval or held(state, tool):
        ctx.log.stage(handle, [decided])
        await authority.approval(ctx, handle, tool, handle.state.actions[step], pending)
        return True, 1
    deadline = now_ms() + int(tool.timeout_for(args) * 1000)
    if await over_limit(ctx, handle, agent, [(tool, step, args)], deadline, pending,
                        [decided]):
        return True, 1
    try:
        await ctx.commit(handle, pending, [decided, Spec(ev.ActionDispatched, {
            "step": step, "key": key, "deadline": deadline})],
            ledger=[("c", key, f"claimed|{deadline}")], dispatch=True)
    except Claimed as exc:
        return await claimed(ctx, handle, lease, exc)
    act = handle.state.actions[step]
    ctx.hooks.after_outcome(handle.run_id, step - 1)
    ctx.hooks.after_intent(handle.run_id, step)
    return await run_tool(ctx, handle, tool, act, slot, pending)


async def claimed(ctx: StepContext, handle: RunHandle, lease: Lease,
                  exc: Claimed) -> tuple[bool, int]:
    """The ledger knows a key the log does not: never send it blindly."""
    await ctx.io.stat("duplicates_suppressed")
    await ctx.io.count(counters.DUPLICATES)
    fresh = await ctx.load(handle.run_id, lease)
    if fresh is not None:
        await ctx.quarantine(fresh, f"key {exc.key} is claimed in the ledger "
                             f"({exc.value}) but the log has no dispatch for it")
    return True, 0


async def decide_group(ctx: StepContext, handle: RunHandle, agent: Agent, slot: Slot,
                       pending: list[Spec], lease: Lease,
                       decision: Parallel) -> tuple[bool, int]:
    """Several calls decided at once (``workers.parallel``): intents, claims and
    dispatches in one commit, then every call at once."""
    state, run_id = handle.state, handle.run_id
    try:
        group = parallel.check_group(agent, ctx.registry, state, decision,
                                     ctx.settings.payloads.max_payload_bytes,
                                     ctx.settings.log.action_window)
    except (UnknownTool, ValueError, TypeError) as exc:
        await ctx.commit(handle, pending, [])
        await ctx.quarantine(handle, f"steps from {state.step + 1}: {exc}")
        return True, 0
    why = parallel.exhausted(state, group)
    if why is not None:
        await ctx.commit(handle, pending, [Spec(ev.Failed, {
            "error": f"{budgets.REASON}: {why}", "reason": budgets.REASON})])
        await ctx.io.stat("budgets_exhausted")
        return True, 0
    for step, args in zip(group.steps, group.args, strict=True):
        handle.live_args[step] = args
    decided = parallel.intents(run_id, group, decision.values, state.config)
    if state.cancel is not None:  # call-scoped cancel pending: record, never send
        reason = state.cancel.reason
        await ctx.commit(handle, pending, [*decided, *[Spec(ev.CallCanceled, {
            "step": s, "key": step_key(run_id, s), "reason": reason})
            for s in group.steps]])
        return False, len(group.steps)
    reused: list[Spec] = []
    if state.hold_effects:  # a counterfactual fork: each call reused, simulated or sent
        plan = await authority.counterfactual_group(ctx, handle, group, decided, pending)
        if plan.done is not None or plan.group is None:
            return plan.done or (True, 0)
        reused, group = plan.reused, plan.group
    longest = now_ms() + int(max(t.timeout_for(a) for t, a in
                                 zip(group.tools, group.args, strict=True)) * 1000)
    if await over_limit(ctx, handle, agent, list(zip(group.tools, group.steps, group.args,
                                                     strict=True)),
                        longest, pending, decided):
        return True, len(group.steps)
    sent, ledger = parallel.dispatches(run_id, group)
    try:
        await ctx.commit(handle, pending, [*decided, *reused, *sent], ledger=ledger,
                         dispatch=True)
    except Claimed as exc:
        return await claimed(ctx, handle, lease, exc)
    ctx.hooks.after_outcome(run_id, group.steps[0] - 1)
    for step in group.steps:
        ctx.hooks.after_intent(run_id, step)
    calls = [(tool, handle.state.actions[step])
             for step, tool in zip(group.steps, group.tools, strict=True)]
    return await run_group(ctx, handle, calls, slot, pending)


async def run_group(ctx: StepContext, handle: RunHandle, calls: list[tuple[Tool, Action]],
                    slot: Slot, pending: list[Spec]) -> tuple[bool, int]:
    """The calls of a group at once, each on a thread of its own."""
    run_id, agent_name = handle.run_id, handle.state.agent
    # Outcomes land as they arrive: each is committed by the thread that observed it
    # (the coroutine waits meanwhile, so only these threads touch the handle, one at a
    # time). Once one commit is refused, the others are kept for the loop to stage
    # after its reload.
    lock = threading.Lock()
    held: list[Spec] = []
    refused: list[Exception] = []

    def record(step: int, spec: list[Spec]) -> None:
        with lock:
            if refused or not spec:
                held.extend(spec)
                return
            try:
                ctx.log.commit(handle, spec)
            except (ConflictError, CancelPending, LeaseLost, Terminal,
                    redis.RedisError) as exc:
                refused.append(exc)
                held.extend(spec)
                return
            ctx.hooks.after_outcome(run_id, step)

    def one(tool: Tool, act: Action) -> list[Spec]:
        began = time.monotonic()
        args = handle.live_args.get(act.step, act.args)
        with tracing.dispatch_span(run_id, agent_name, tool, act, args,
                                   ctx.settings.models) as span:
            spec = ctx.dispatcher.dispatch(run_id, tool, act, slot.token, args)
            ctx.limiter.release(run_id, act.step, spec)
            outcome = counters.OUTCOMES.get(spec[0].cls, spec[0].cls.__name__) \
                if spec else ""
            span.recorded(outcome, spec[0].fields if spec else {})
        ctx.hooks.after_effect(run_id, act.step)
        ctx.hooks.step_done(act.tool, outcome, time.monotonic() - began)
        record(act.step, spec)
        return spec

    def run_all() -> list[list[Spec]]:
        with ctx.outside():
            slot.in_call = True
            try:
                return parallel.run_at_once(calls, one)
            finally:
                slot.in_call = False

    await Offload(BLOCKING, run_all)
    if slot.token.cancelled and slot.token.reason == "lease lost":
        raise LeaseLost(run_id, Lease(run_id, handle.lease or "|-1").epoch)
    if slot.token.cancelled:
        slot.token = CancelToken()
    if refused:  # the loop reloads, then stages the outcomes not in the log yet
        pending[:] = held
        raise refused[0]
    return False, len(calls)


async def run_tool(ctx: StepContext, handle: RunHandle, tool: Tool, act: Action, slot: Slot,
                   pending: list[Spec]) -> tuple[bool, int]:
    """Send ``act`` (its intent and dispatch are in the log) and stage its outcome."""
    args = handle.live_args.get(act.step, act.args)
    if is_placeholder(args):
        await ctx.commit(handle, pending, [])
        await ctx.quarantine(handle, f"step {act.step} ({act.tool}): its arguments were "
                                      "kept out of the log and the agent did not give "
                                      "them again")
        return True, 0
    began = time.monotonic()
    with tracing.dispatch_span(handle.run_id, handle.state.agent, tool, act, args,
                               ctx.settings.models) as span:
        def call() -> list[Spec]:
            with ctx.outside():
                slot.thread_id, slot.in_call = threading.get_ident(), True
                try:
                    spec = ctx.dispatcher.dispatch(handle.run_id, tool, act, slot.token,
                                                   args)
                    ctx.limiter.release(handle.run_id, act.step, spec)
                    return spec
                finally:
                    slot.in_call = False

        if aio.is_async_tool(ctx, tool):  # awaited on the event loop: no thread waits
            spec = await aio.call_tool(ctx, handle.run_id, tool, act, slot, args)
        else:
            spec = await Offload(act.tool, call)
        outcome = counters.OUTCOMES.get(spec[0].cls, spec[0].cls.__name__) if spec else ""
        span.recorded(outcome, spec[0].fields if spec else {})
    ctx.hooks.after_effect(handle.run_id, act.step)
    ctx.hooks.step_done(act.tool, outcome, time.monotonic() - began)
    return await outcomes(ctx, handle, slot, pending, spec, 1)


async def outcomes(ctx: StepContext, handle: RunHandle, slot: Slot, pending: list[Spec],
                   specs: list[Spec], steps: int) -> tuple[bool, int]:
    """Stage the outcomes of ``steps`` calls just made; commit them at once when the
    run must stop for them (a wait, an unknown outcome, a cancel)."""
    if slot.token.cancelled and slot.token.reason == "lease lost":
        raise LeaseLost(handle.run_id, Lease(handle.run_id, handle.lease or "|-1").epoch)
    if slot.token.cancelled:
        slot.token = CancelToken()
    pending[:] = specs
    ctx.log.stage(handle, specs)
    if handle.state.waiting or handle.state.state == "outcome_unknown" or (
        handle.state.cancel is not None
    ):
        await ctx.commit(handle, pending, [])
        ctx.hooks.after_outcome(handle.run_id, handle.state.step)
    return False, steps


async def over_limit(ctx: StepContext, handle: RunHandle, agent: Agent,
                     calls: list[tuple[Tool, int, Any]], deadline: int,
                     pending: list[Spec], specs: list[Spec]) -> bool:
    """Flow control (``durable.flow.limits``): False when every limiter of ``calls`` gave a
    permit (lapsing after ``deadline``); else ``specs`` (the intents) are recorded and the
    run waits as a timer, holding no slot: not an error, no retry consumed."""
    wait = await ctx.limiter.take_all_async(handle.state, agent, calls,
                                            deadline + ctx.settings.cancel.grace_ms)
    if wait is None:
        return False
    if handle.staged or specs:
        await ctx.commit(handle, pending, specs)
    await ctx.park(handle.run_id, wait)
    return True
