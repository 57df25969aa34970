"""What a job checks before the run's first step, after its lease and fold: the run limits
of its agent, an unsigned rejection in its log, the agent's version and configuration
policies (``workers.gates.resume_policy``: a run of another version goes to a worker that has
it, waits for an approval, or is quarantined; a run whose pinned configuration differs from
the worker's goes on, is told, waits for an approval or expires, as the agent declares), and
the re-observing of the open intent (the agent must decide what the log recorded). Each check
writes at most what it decides, through the step context it is given (``workers.context``).
"""

from __future__ import annotations

import logging

import redis

from durable.agents import Agent, Parallel
from durable.agents import configuration as config_
from durable.audit.replay import matching_call
from durable.code import CodeAgent
from durable.errors import NondeterminismError
from durable.leases import Lease
from durable.log import counters
from durable.log import events as ev
from durable.log.store import RunHandle, Spec

from . import aio, authority
from .context import StepContext
from .gates import resume_policy
from .steps import agent_traceback

log = logging.getLogger("durable.worker")


async def admit(ctx: StepContext, handle: RunHandle, agent: Agent, lease: Lease,
                kept: bool) -> bool:
    """Whether the job goes on to the run's steps. It does not when the run waits for a
    run limit (nothing written), a rejection in its log is unsigned, its agent's version
    policy quarantines it, makes it wait for an approval or hands it to a worker of its own
    version, or its open intent does not re-observe (``kept``: a code agent's function goes
    on from the last job, nothing to re-observe). What is admitted is staged on ``handle``.
    """
    run_id = handle.run_id
    wait = await ctx.limiter.take_run(handle.state, agent)
    if wait is not None:  # at most N runs per key in flight: it waits, nothing written
        await ctx.park(run_id, wait)
        return False
    ctx.log.stage(handle, [Spec(ev.LeaseAcquired, {"owner": lease.owner,
                                                     "epoch": lease.epoch})])
    forged = await authority.unsigned_rejection(ctx, handle)
    if forged is not None:
        await ctx.quarantine(handle, forged, counts=counters.resume_failure("unsigned_rejection"))
        return False
    state, check = handle.state, authority.approval_check(ctx, run_id)
    try:
        have = config_.pinned(ctx.configuration(agent), agent.on_configuration_change)
    except Exception as exc:  # agent code: its bug quarantines the run, not the worker
        await ctx.quarantine(handle, f"agent {agent.name} raised {exc!r} in configuration()",
                             traceback=agent_traceback(exc))
        return False
    if state.agent_version == agent.version and state.config in (have, {}):
        verdict, specs, why = resume_policy(state, agent, have, check)
    else:  # a decision on the upgrade is checked against the approver registry
        verdict, specs, why = await ctx.io.elsewhere(
            lambda: resume_policy(state, agent, have, check))
    if verdict != "ok" and state.agent_version != agent.version \
            and await hand_to_its_version(ctx, handle, lease):
        return False
    if verdict == "quarantine":
        await ctx.quarantine(handle, why, counts=counters.resume_failure("version"))
        return False
    if verdict == "wait":
        await ctx.log.commit_async(handle, specs, checkpoint=True)
        return False
    if verdict == "expire":  # a terminal commit: it frees run limits and wakes a parent
        log.info("run %s expires: %s", run_id, why)
        await ctx.commit(handle, [], specs)
        return False
    ctx.log.stage(handle, specs)
    try:
        if not kept:
            await check_replay(ctx, handle, agent)
    except NondeterminismError as exc:
        await ctx.quarantine(handle, str(exc), counts=counters.resume_failure("nondeterminism"))
        return False
    except redis.RedisError:  # Redis failed under the re-observing, not the agent
        raise
    except Exception as exc:  # an agent bug met while re-observing: keep the evidence
        await ctx.quarantine(handle, f"agent {agent.name} raised {exc!r} on recovery",
                             traceback=agent_traceback(exc),
                             counts=counters.resume_failure("agent_error"))
        return False
    return True


async def route(ctx: StepContext, handle: RunHandle, lease: Lease, to: str) -> None:
    """Put the run on the ready list ``to``, where a worker that has its agent (or
    its version) takes it from. Nothing is written."""
    await ctx.let_go(lease)  # before it is ready again: a taker finds it free
    await ctx.io.enqueue(handle.run_id, force=True, route=to)
    await ctx.io.stat("runs_routed")


async def hand_to_its_version(ctx: StepContext, handle: RunHandle, lease: Lease) -> bool:
    """A run of another version of the agent, which this worker's code may not take
    over (its ``on_version_change``): when a live worker has the run's own version (an
    old worker during a rolling deploy), the run goes on that version's ready list
    instead of being quarantined or held for an approval. Nothing is written."""
    to = f"{handle.state.agent}@{handle.state.agent_version}"
    if not any(to in serves for serves in (await ctx.io.served_agents()).values()):
        return False
    log.info("run %s: started under %s, handed to a worker that has that version",
             handle.run_id, to)
    await route(ctx, handle, lease, to)
    return True


async def check_replay(ctx: StepContext, handle: RunHandle, agent: Agent) -> None:
    """Re-observe the open intent: the agent must decide what the log recorded."""
    act, before = handle.state.current, handle.pre_intent
    if act is None or act.undoes:  # a compensation is the cancel's, not the agent's
        return
    if isinstance(agent, CodeAgent):
        before = handle.state  # a code agent rebuilds its history from the whole log
    elif before is None or before.step + 1 != act.step or act.group:
        # The intent is older than the checkpoint the load started from, or part of a
        # group, whose state before it is not kept: it is not re-decided.
        return
    seen = before
    decided = await aio.next_decision(ctx, agent, seen)
    call = matching_call(handle.run_id, decided, act.step, act.tool, act.args, act.group)
    handle.live_args[act.step] = call.args
    if isinstance(decided, Parallel):  # the group's other open calls go out again too
        for step, member in zip(decided.steps, decided.calls, strict=False):
            handle.live_args.setdefault(step, member.args)
    await ctx.io.stat("replayed_intents")
