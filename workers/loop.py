"""The step protocol, as run by a worker holding a run's lease.

For each step: the agent decides; the intent (step, tool, args, key) and the ledger claim of
its key are recorded in one script call; the effect is dispatched with the key and a
deadline; its outcome is staged and recorded together with the next step's intent (one
round trip per step). A claimed key with no outcome is *unknown* and is resolved with the
tool's ``lookup`` once the earlier dispatch's deadline has passed, before anything is sent
again. Every append checks the lease's fencing epoch: a worker that lost its lease writes
nothing and drops its work.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import redis

from durable import budgets, tracing
from durable.agents import (
    Agent,
    Cancel,
    Fail,
    Finish,
    Parallel,
    Registry,
    Tool,
    Wait,
    digest_placeholder,
    is_placeholder,
)
from durable.approvals import check_history, check_recorded
from durable.approvers import Approvers
from durable.cancellation import CancelToken, cancel_children, finish_specs
from durable.children import child_state, wake_parent
from durable.code import CodeAgent
from durable.connection import connect_queue
from durable.errors import (
    CancelPending,
    Claimed,
    ConflictError,
    DecodeError,
    LeaseLost,
    NondeterminismError,
    RunNotFound,
    Terminal,
    UnknownAgent,
    UnknownTool,
)
from durable.leases import Heartbeats, Lease, Leases
from durable.liveness import served_agents
from durable.log import counters, keys
from durable.log import events as ev
from durable.log.batching import drive
from durable.log.keys import CHILD_TOOL, RUN_ID_RE
from durable.log.replay import matching_call
from durable.log.state import Action, RunState
from durable.log.store import EventLog, RunHandle, Spec, now_ms
from durable.outages import Outage
from durable.outcomes import LOOKUP_RETRY_MS, resolve_unknown
from durable.queue import enqueue_advance, make_queue
from durable.settings import Settings
from durable.settling import unsigned_settle
from workers import parallel
from workers.dispatch import Dispatcher
from workers.gates import Check, gate, request_specs, revalidate, version_policy
from workers.hooks import HookChain, StepHooks
from workers.steps import agent_traceback, plain, recorded, step_key, values_field
from workers.turns import (
    SLOT,
    STEP_TURNS,
    WAITING,
    Abandoned,
    Offload,
    Outside,
    Slot,
    Turns,
    UserCode,
)

log = logging.getLogger("durable.worker")

#: Longest a worker waits in place for an earlier dispatch's deadline before a lookup.
MAX_INLINE_WAIT_S = 30.0

#: Events after which a job has nothing left to do: their batch also releases the lease.
_LAST_WRITES = (ev.Completed, ev.Failed, ev.Canceled, ev.Expired, ev.WaitEntered,
                ev.Quarantined)


class StepLoop:
    """Drives the runs this worker holds through the step protocol (see the module doc)."""

    def __init__(self, settings: Settings, client: redis.Redis, registry: Registry,
                 worker_id: str, queue_name: str | None = None,
                 hooks: StepHooks | None = None) -> None:
        self.settings = settings
        self.redis = client
        self.registry = registry
        self.worker_id = worker_id
        # Agent and tool code runs here: sealed fields are opened when read, and sealed
        # again when written (checkpoints too).
        self.log = EventLog.from_settings(client, settings, open_sealed=True,
                                          sealed_names=registry.sensitive_names(),
                                          lean_agents=registry.rebuilt_agents())
        self.leases = Leases(client, settings.lease_ttl_ms)
        # The run threads' appends and lease acquisitions go out together.
        self.leases.batcher = self.log.batch_appends()
        #: The approver registry: a decision is checked again before its call is sent.
        self.approvers = Approvers(client, self.log.admin_keys)
        self.heartbeats = Heartbeats(self.leases)
        #: Leases let go by a job's last write (append.lua's "r" flag).
        #: (run, lease value): a lease value is "<worker>|<epoch>", the same for two runs
        #: whose epochs agree, so the run id is part of the key.
        self._released: set[tuple[str, str]] = set()
        #: RQ and the ready list: on DURABLE_QUEUE_URL's server, else the log's.
        self.queue = make_queue(connect_queue(settings, client), queue_name or settings.queue)
        self.dispatcher = Dispatcher(settings.cancel_grace_ms, settings.max_payload_bytes,
                                     on_stuck=self.stuck_call)
        self.held: dict[str, Slot] = {}
        self.hooks = hooks or HookChain()
        self.outage = Outage(log)
        #: Threads whose run was abandoned: their slot was given back already.
        self.abandoned_threads: set[int] = set()
        #: Called with nothing when a slot is given back by the watchdog.
        self.on_abandon: Callable[[], object] = lambda: None
        #: Set once too many tool calls are stuck (``DURABLE_MAX_STUCK_CALLS``); then
        #: ``on_restart`` is called (the worker process: shut down, then start afresh).
        self.restart_requested = threading.Event()
        self.on_restart: Callable[[], object] = lambda: None
        #: Called on a run's thread just before the commit that ends its work here (and
        #: releases its lease): the pool sends its pop of the next ready run along with it.
        self.before_last_commit: Callable[[], object] = lambda: None
        #: Turns for driving steps (``workers.turns.STEP_TURNS``).
        self.turns = Turns(STEP_TURNS)
        #: Set on shutdown: every run lets go at its next step boundary.
        self.stopping = threading.Event()

    # Entry point ------------------------------------------------------------------------

    def advance(self, run_id: str) -> dict[str, Any]:
        """Drive ``run_id`` on this thread (a run thread, or RQ's for an ``advance``
        command), its Redis calls batched with the other threads' (one of the step turns
        held meanwhile)."""
        with self.turns.inside():
            return drive(self.advance_async(run_id))

    async def advance_async(self, run_id: str) -> dict[str, Any]:
        """The step protocol for one held run, as a coroutine whose batched Redis calls are
        sent by whoever drives it: ``advance`` on a thread, or a worker's hub
        (``workers.hub``), which drives many at once from one thread."""
        return await self._advance(run_id)

    async def _advance(self, run_id: str) -> dict[str, Any]:
        if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
            # A malformed command: nothing to drive, nothing to write.
            self.redis.hincrby(keys.STATS, "malformed_commands", 1)
            log.error("refused a command naming run %r: not a valid run id", run_id)
            return {"refused": "invalid run id"}
        lease, version, raw = await self.leases.acquire_async(run_id, self.worker_id,
                                                              take_queued=True)
        if lease is None:
            return {"run": run_id, "skipped": "lease held by another worker"}
        slot = Slot(lease, thread_id=threading.get_ident())
        SLOT.set(slot)
        self.held[run_id] = slot
        self.heartbeats.hold(lease, lambda: slot.token.cancel("lease lost"))
        more = False
        try:
            more = await self._drive(run_id, lease, slot, version, raw)
        except LeaseLost as exc:
            log.warning("run %s: %s; work discarded", run_id, exc)
            # Back on the ready list at once: if the lease only expired (nobody took it),
            # the run would otherwise wait for the reconciler. A newer holder makes the next
            # attempt a no-op; fencing keeps anything stale out of the log either way.
            more = not slot.abandoned
        finally:
            self.heartbeats.drop(lease)
            if self.held.get(run_id) is slot:
                self.held.pop(run_id, None)
            if (run_id, lease.value) in self._released:
                self._released.discard((run_id, lease.value))
            else:
                self.leases.release(lease)
        if more:
            enqueue_advance(self.redis, self.queue, run_id, route=slot.route)
        return {"run": run_id, "more": more}

    def hand_back(self) -> list[str]:
        """Let go of every held run at once (shutdown): stop renewing, signal the run's token,
        release the lease and make the run ready again. A write the run's thread still
        attempts is refused by fencing; an effect in flight is found ``dispatched`` by the
        next worker, which asks ``lookup`` once its deadline has passed."""
        handed = []
        for run_id, slot in list(self.held.items()):
            if slot.lease is None:
                continue
            self.heartbeats.drop(slot.lease)
            slot.token.cancel("lease lost")
            if self.leases.release(slot.lease):
                enqueue_advance(self.redis, self.queue, run_id, force=True, route=slot.route)
                handed.append(run_id)
        return handed

    def check_overruns(self, now: float | None = None) -> list[str]:
        """The watchdog: abandon every run whose agent code has run longer than
        ``DURABLE_DECIDE_TIMEOUT_MS``. Returns their ids."""
        limit = self.settings.decide_timeout_ms / 1000
        now = time.monotonic() if now is None else now
        overran = []
        for run_id, slot in list(self.held.items()):
            since = slot.user_code_since
            if since and now - since > limit and not slot.abandoned:
                self.abandon(run_id, slot, f"{slot.user_code} did not return within "
                                           f"{self.settings.decide_timeout_ms} ms")
                overran.append(run_id)
        return overran

    def abandon(self, run_id: str, slot: Slot, reason: str) -> None:
        """Stop holding a run whose agent code is wedged: quarantine it with ``reason``, let
        go of its lease, give its slot back, and interrupt its thread (``Abandoned``). A
        write the thread still attempts is refused (version and fencing)."""
        log.error("run %s: %s; quarantined, its slot goes on with other runs", run_id, reason)
        self._let_go(run_id, slot, reason, "user_code_overruns")
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(slot.thread_id),
                                                   ctypes.py_object(Abandoned))

    def stuck_call(self, thread_id: int) -> None:
        """A tool call on ``thread_id`` did not stop when interrupted (blocked in C, or it
        swallows the interrupt): give its run up -- lease released, run ready again -- so
        another thread continues it from the log and resolves the call with ``lookup``
        once its deadline has passed. The stuck thread is abandoned with its slot given
        back; if it ever returns, nothing of its call is written (``CallAbandoned``)."""
        for run_id, slot in list(self.held.items()):
            if slot.thread_id == thread_id and slot.in_call and not slot.abandoned:
                log.error("run %s: its tool call did not stop when interrupted; the run is "
                          "handed back and its slot goes on with other runs", run_id)
                self._let_go(run_id, slot, None, "stuck_calls")
        stuck = self.dispatcher.watch.stuck_now
        if stuck >= self.settings.max_stuck_calls and not self.restart_requested.is_set():
            # Each stuck call keeps its thread (and what its tool holds) until it returns,
            # which may be never: past the bound, the process is renewed.
            log.error("%d tool calls are stuck in this process (DURABLE_MAX_STUCK_CALLS=%d): "
                      "it hands its runs back and restarts", stuck,
                      self.settings.max_stuck_calls)
            self.restart_requested.set()
            self.on_restart()

    def _let_go(self, run_id: str, slot: Slot, quarantine: str | None, stat: str) -> None:
        """Abandon ``slot``'s thread: quarantine the run with the reason given, or make it
        ready again; release its lease; give the slot back."""
        slot.abandoned = True
        self.abandoned_threads.add(slot.thread_id)
        self.held.pop(run_id, None)
        if slot.lease is not None:
            self.heartbeats.drop(slot.lease)
        try:
            moved_on = False
            if quarantine is not None:
                moved_on = not self.log.quarantine(run_id, quarantine, self.worker_id)
            if slot.lease is not None:
                self.leases.release(slot.lease)
            if quarantine is None or moved_on:  # let another attempt continue it
                enqueue_advance(self.redis, self.queue, run_id, force=True, route=slot.route)
            self.redis.hincrby(keys.STATS, stat, 1)
        except redis.RedisError as exc:  # the lease expires; the reconciler takes it from there
            self.outage.failed(exc)
        finally:
            self.on_abandon()

    def _user(self, what: str, fn: Callable[[], Any]) -> Offload:
        """Agent code ``fn`` for the current run, to ``await``: the watchdog times it on
        whichever thread runs it (and, on a run thread, its turn is given back)."""
        slot = SLOT.get()

        def timed() -> Any:
            with UserCode(self.turns, what, slot):
                return fn()

        return Offload(what, timed)

    def _outside(self) -> Outside:
        """This thread waits on user code, a tool, or a deadline: give its turn back."""
        return self.turns.outside()

    # The loop -------------------------------------------------------------------------

    def _load(self, run_id: str, lease: Lease, version: int | None = None,
              raw: Any = None) -> RunHandle | None:
        try:
            if version is not None:
                return self.log.handle_from(run_id, version, raw, lease=lease.value,
                                            actor=self.worker_id)
            return self.log.load(run_id, lease=lease.value, actor=self.worker_id)
        except DecodeError as exc:
            self.log.quarantine(run_id, f"unreadable log entry {exc.entry_id}: {exc.reason}",
                                self.worker_id)
        except RunNotFound:
            pass
        return None

    async def _drive(self, run_id: str, lease: Lease, slot: Slot, version: int, raw: Any) -> bool:
        """Run steps until the run stops needing this worker. True when work is left."""
        handle = self._load(run_id, lease, version, raw)
        if handle is None or not self._needs_work(handle.state):
            return False
        slot.route = handle.state.agent
        try:
            agent = self.registry.agent(handle.state.agent)
        except UnknownAgent:
            # Taken from the shared list (made ready before routing): its agent's own list
            # is where a worker that has it takes it from.
            log.info("run %s: agent %s is not served here; put on its own ready list",
                     run_id, handle.state.agent)
            self.leases.release(lease)  # before it is ready again: a taker finds it free
            self._released.add((run_id, lease.value))
            enqueue_advance(self.redis, self.queue, run_id, force=True,
                            route=handle.state.agent)
            self.redis.hincrby(keys.STATS, "runs_routed", 1)
            return False
        kept = False
        if isinstance(agent, CodeAgent):
            agent.bind(self.log)
            kept = agent.resume(run_id, handle.state.version)
        try:
            with tracing.run_span(run_id, handle.state.agent, handle.state.trace):
                return await self._drive_agent(handle, agent, lease, slot, kept)
        finally:
            if slot.park_at is not None and isinstance(agent, CodeAgent):
                agent.park(run_id, slot.park_at)
            else:
                agent.close_run(run_id)

    async def _drive_agent(self, handle: RunHandle, agent: Agent, lease: Lease, slot: Slot,
                           kept: bool = False) -> bool:
        """``kept``: a code agent's function goes on from the last job (nothing to
        re-observe: it issued the open intent itself)."""
        run_id = handle.run_id
        self.log.stage(handle, [Spec(ev.LeaseAcquired, {"owner": lease.owner,
                                                         "epoch": lease.epoch})])
        forged = self._unsigned_rejection(handle)
        if forged is not None:
            await self._quarantine(handle, forged)
            return False
        verdict, specs, why = version_policy(handle.state, agent,
                                             self._approval_check(run_id))
        if verdict != "ok" and self._hand_to_its_version(handle, lease):
            return False
        if verdict == "quarantine":
            await self._quarantine(handle, why)
            return False
        if verdict == "wait":
            await self.log.commit_async(handle, specs, checkpoint=True)
            return False
        self.log.stage(handle, specs)
        try:
            if not kept:
                await self._check_replay(handle, agent)
        except NondeterminismError as exc:
            await self._quarantine(handle, str(exc))
            return False
        except Exception as exc:  # an agent bug met while re-observing: keep the evidence
            await self._quarantine(handle, f"agent {agent.name} raised {exc!r} on recovery",
                                   traceback=agent_traceback(exc))
            return False
        # Outcomes observed but not yet in the log: they survive a reload after a conflict.
        pending: list[Spec] = []
        steps = conflicts = 0
        while True:
            try:
                if handle.state.resumed and self._needs_work(handle.state):
                    await self._revalidate(handle, agent, pending)
                    continue
                done, stepped = await self._step(handle, agent, slot, pending, lease)
                conflicts = 0
            except (ConflictError, CancelPending):
                conflicts += 1
                if conflicts > 100:  # someone keeps writing: let go, come back later
                    log.warning("run %s: too many conflicts; re-queued", run_id)
                    return True
                fresh = self._reload(handle, lease, pending)
                if fresh is None:
                    return False
                handle = fresh
                forged = self._unsigned_rejection(handle)  # someone else wrote meanwhile
                if forged is not None:
                    await self._quarantine(handle, forged)
                    return False
                continue
            except Terminal:
                return False
            steps += stepped
            if done:
                return False
            if steps >= self.settings.steps_per_job or self.stopping.is_set():
                # Its turn is used up, or the worker is shutting down: let go at this step
                # boundary (the run goes back on the ready list).
                if handle.staged:
                    await self._commit(handle, pending, [])
                more = self._needs_work(handle.state)
                if more and not self.stopping.is_set():
                    slot.park_at = handle.state.version
                return more

    def _hand_to_its_version(self, handle: RunHandle, lease: Lease) -> bool:
        """A run of another version of the agent, which this worker's code may not take
        over (its ``on_version_change``): when a live worker has the run's own version (an
        old worker during a rolling deploy), the run goes on that version's ready list
        instead of being quarantined or held for an approval. Nothing is written."""
        route = f"{handle.state.agent}@{handle.state.agent_version}"
        if not any(route in serves for serves in served_agents(self.redis).values()):
            return False
        log.info("run %s: started under %s, handed to a worker that has that version",
                 handle.run_id, route)
        self.leases.release(lease)
        self._released.add((handle.run_id, lease.value))
        enqueue_advance(self.redis, self.queue, handle.run_id, force=True, route=route)
        self.redis.hincrby(keys.STATS, "runs_routed", 1)
        return True

    async def _revalidate(self, handle: RunHandle, agent: Agent, pending: list[Spec]) -> None:
        verdict, spec = await self._user(f"{agent.name}.revalidate()",
                                         lambda: revalidate(handle.state, agent, self.registry))
        if spec is not None:
            await self._commit(handle, pending, [spec])
            if verdict == "quarantine":
                self.redis.hset(keys.QUARANTINE, handle.run_id, str(spec.fields["reason"]))
        else:
            handle.state.resumed = False  # checked once per resume; the log need not say so

    def _reload(self, handle: RunHandle, lease: Lease, pending: list[Spec]) -> RunHandle | None:
        fresh = self._load(handle.run_id, lease)
        if fresh is None:
            return None
        fresh.live_args = handle.live_args
        if pending and recorded(handle.state, fresh.state, pending):
            # The commit that carried them ran, and its reply was lost (a connection cut
            # after the script ran): the batch was sent again and refused as a conflict.
            pending.clear()
        if pending:
            self.log.stage(fresh, pending)
        return fresh

    async def _commit(self, handle: RunHandle, pending: list[Spec], specs: list[Spec],
                **kw: Any) -> None:
        """Commit what is staged plus ``specs``; once in the log, nothing is pending.

        A batch that ends the job's work (terminal, waiting) also lets go of the lease in the
        same script call.
        """
        release = any(issubclass(s.cls, _LAST_WRITES) for s in specs) and not kw.get("if_free")
        if release:
            self.before_last_commit()
        await self.log.commit_async(handle, specs, release=release, **kw)
        pending.clear()
        if release:
            self._released.add((handle.run_id, handle.lease))
            if handle.state.terminal and handle.state.parent_step:  # a child ended
                self._woke(wake_parent(self.log, handle.state, self.worker_id))

    def _woke(self, parent: str | None) -> None:
        """Make a parent whose wait for a child was just resolved ready again."""
        if parent is not None:
            enqueue_advance(self.redis, self.queue, parent, force=True)

    @staticmethod
    def _needs_work(state: RunState) -> bool:
        return not (state.terminal or state.waiting or state.state == "quarantined")

    async def _quarantine(self, handle: RunHandle, reason: str, traceback: str = "") -> None:
        if traceback:
            log.error("run %s quarantined: %s\n%s", handle.run_id, reason, traceback.rstrip())
        else:
            log.error("run %s quarantined: %s", handle.run_id, reason)
        handle.staged = []
        handle.staged_counts = []  # what the dropped events would have counted
        fields: dict[str, Any] = {"reason": reason}
        if traceback:
            fields["traceback"] = traceback
        try:
            await self.log.commit_async(handle, [Spec(ev.Quarantined, fields)],
                                        extra={"reason": reason[:500]})
            self.redis.hset(keys.QUARANTINE, handle.run_id, reason[:500])
        except (ConflictError, Terminal, LeaseLost):
            self.log.quarantine(handle.run_id, reason, self.worker_id)

    async def _check_replay(self, handle: RunHandle, agent: Agent) -> None:
        """Re-observe the open intent: the agent must decide what the log recorded."""
        act, before = handle.state.current, handle.pre_intent
        if act is None:
            return
        if isinstance(agent, CodeAgent):
            before = handle.state  # a code agent rebuilds its history from the whole log
        elif before is None or before.step + 1 != act.step or act.group:
            # The intent is older than the checkpoint the load started from, or part of a
            # group, whose state before it is not kept: it is not re-decided.
            return
        seen = before
        decided = await self._user(f"{agent.name}.decide()", lambda: agent.decide(seen))
        call = matching_call(handle.run_id, decided, act.step, act.tool, act.args, act.group)
        handle.live_args[act.step] = call.args
        if isinstance(decided, Parallel):  # the group's other open calls go out again too
            for step, member in zip(decided.steps, decided.calls, strict=False):
                handle.live_args.setdefault(step, member.args)
        self.redis.hincrby(keys.STATS, "replayed_intents", 1)

    async def _step(
        self, handle: RunHandle, agent: Agent, slot: Slot, pending: list[Spec], lease: Lease
    ) -> tuple[bool, int]:
        """One pass: returns (stop, steps taken)."""
        state = handle.state
        if slot.token.cancelled and slot.token.reason == "lease lost":
            raise LeaseLost(handle.run_id, lease.epoch)
        if not self._needs_work(state):
            if handle.staged:
                await self._commit(handle, pending, [])
            return True, 0
        if state.cancel is not None and state.cancel.scope == "run":
            await self._finish_cancel(handle, pending)
            return True, 0
        act = state.current
        if act is None:
            return await self._decide(handle, agent, slot, pending, lease)
        if act.status in ("decided", "not_applied"):
            if state.cancel is not None:  # a call-scoped cancel: this call never starts
                await self._commit(handle, pending, [Spec(ev.CallCanceled, {
                    "step": act.step, "key": act.key, "reason": state.cancel.reason})])
                return False, 0
            tool = self.registry.tool(act.tool)
            asked = await self._approval(handle, tool, act, pending)
            if asked is not None:
                return asked
            deadline = now_ms() + int(tool.timeout_s * 1000)
            await self._commit(handle, pending, [Spec(ev.ActionDispatched, {
                "step": act.step, "key": act.key, "deadline": deadline})],
                ledger=[("p", act.key, f"claimed|{deadline}")], dispatch=True)
            return await self._run_tool(handle, tool, act, slot, pending)
        # dispatched or unknown: the earlier attempt may have applied the effect.
        tool = self.registry.tool(act.tool)
        if tool.effect_free:  # nothing outside changed: send it again at once...
            if act.attempts >= tool.max_attempts:  # ...but not forever
                specs = [Spec(ev.ActionFailed, {
                    "step": act.step, "key": act.key, "error_type": "NoOutcome",
                    "error": f"no outcome after {act.attempts} attempts "
                             f"(last: {act.unknown_reason or 'lost'})"})]
            else:
                specs = [Spec(ev.ActionReconciled, {"step": act.step, "key": act.key,
                                                    "resolution": "not_applied",
                                                    "by": "effect_free"})]
                self.redis.hincrby(keys.STATS, "effect_free_resent", 1)
            pending[:] = specs
            self.log.stage(handle, specs)
            return False, 0
        wait_s = (act.deadline + self.settings.clock_skew_ms) / 1000 - time.time()
        if wait_s > MAX_INLINE_WAIT_S:
            if handle.staged:
                await self._commit(handle, pending, [])
            return True, 0
        def wait_and_ask() -> list[Spec] | None:
            with self._outside():
                if wait_s > 0 and slot.token.wait(wait_s):
                    return None  # a cancel or a lost lease: look at the run again
                return resolve_unknown(self.redis, tool, act, handle.run_id)

        specs = await Offload(WAITING, wait_and_ask)
        if specs is None:
            return False, 0
        if not specs:  # the lookup itself failed: the reconciler asks again shortly
            if handle.staged:
                await self._commit(handle, pending, [])
            self.redis.zadd(keys.due_of(handle.run_id), {handle.run_id: now_ms() + LOOKUP_RETRY_MS})
            return True, 0
        pending[:] = specs
        self.log.stage(handle, specs)
        if handle.state.waiting:
            await self._commit(handle, pending, [], checkpoint=True)
            return True, 0
        return False, 0

    async def _decide(self, handle: RunHandle, agent: Agent, slot: Slot, pending: list[Spec],
                lease: Lease) -> tuple[bool, int]:
        state = handle.state
        try:
            decision = await self._user(f"{agent.name}.decide()",
                                        lambda: agent.decide(state))
        except Exception as exc:  # an agent bug: keep the evidence, quarantine
            await self._commit(handle, pending, [])
            where = agent.name if isinstance(agent, CodeAgent) else f"{agent.name}.decide"
            await self._quarantine(handle, f"agent {where} raised {exc!r}",
                                   traceback=agent_traceback(exc))
            return True, 0
        if isinstance(decision, Finish):
            await self._commit(handle, pending,
                               [Spec(ev.Completed, {"result": plain(decision.result)})])
            self.hooks.after_outcome(handle.run_id, state.step)
            return True, 0
        if isinstance(decision, Fail):
            await self._commit(handle, pending, [Spec(ev.Failed, {"error": decision.error,
                                                                  "reason": decision.reason})])
            return True, 0
        if isinstance(decision, Cancel):  # the agent asked to stop: a cancel, recorded whole
            asked = now_ms()
            await self._commit(handle, pending, [
                Spec(ev.CancelRequested, {"reason": decision.reason, "requested_ts": asked,
                                          "by": agent.name}),
                *finish_specs(state, decision.reason, asked)])
            return True, 0
        if isinstance(decision, list):  # a decide() agent's calls at once
            decision = Parallel(list(decision))
        if isinstance(decision, Parallel):
            return await self._decide_group(handle, agent, slot, pending, lease, decision)
        if isinstance(decision, Wait):
            until = now_ms() + int(decision.timeout_s * 1000)
            await self._commit(handle, pending, [Spec(ev.WaitEntered, {
                "kind": decision.kind, "reason": decision.reason, "until": until,
                "request": f"{handle.run_id}:w{state.version + 1}", "data": decision.data,
                **values_field(decision.values)})], checkpoint=True)
            if decision.kind == "child":  # the child may have ended already
                child = child_state(self.log, str(decision.data["child"]))
                if child is not None:
                    self._woke(wake_parent(self.log, child, self.worker_id))
            return True, 0
        try:
            if decision.tool not in agent.tools and decision.tool != CHILD_TOOL:
                raise UnknownTool(decision.tool)
            tool = self.registry.tool(decision.tool)
            args = plain(decision.args)
            if tool.log_args == "full" and \
                    len(msgspec.msgpack.encode(args)) > self.settings.max_payload_bytes:
                raise ValueError(f"arguments of {decision.tool} exceed "
                                 f"{self.settings.max_payload_bytes} bytes")
        except (UnknownTool, ValueError, TypeError) as exc:
            await self._commit(handle, pending, [])
            await self._quarantine(handle, f"step {state.step + 1}: {exc}")
            return True, 0
        why = budgets.exhausted(state, tool.model)
        if why is not None:
            await self._commit(handle, pending, [Spec(ev.Failed, {
                "error": f"{budgets.REASON}: {why}", "reason": budgets.REASON})])
            self.redis.hincrby(keys.STATS, "budgets_exhausted", 1)
            return True, 0
        step = state.step + 1
        key = step_key(handle.run_id, step)
        recorded = digest_placeholder(args) if tool.log_args == "digest" else args
        handle.live_args[step] = args
        decided = Spec(ev.StepDecided, {"step": step, "tool": tool.name, "args": recorded,
                                        "key": key, "model": tool.model,
                                        **values_field(decision.values)})
        if state.cancel is not None:  # call-scoped cancel pending: record, never send
            await self._commit(handle, pending, [decided, Spec(ev.CallCanceled, {
                "step": step, "key": key, "reason": state.cancel.reason})])
            return False, 1
        if tool.requires_approval:
            self.log.stage(handle, [decided])
            await self._approval(handle, tool, handle.state.actions[step], pending)
            return True, 1
        deadline = now_ms() + int(tool.timeout_s * 1000)
        try:
            await self._commit(handle, pending, [decided, Spec(ev.ActionDispatched, {
                "step": step, "key": key, "deadline": deadline})],
                ledger=[("c", key, f"claimed|{deadline}")], dispatch=True)
        except Claimed as exc:
            return await self._claimed(handle, lease, exc)
        act = handle.state.actions[step]
        self.hooks.after_outcome(handle.run_id, step - 1)
        self.hooks.after_intent(handle.run_id, step)
        return await self._run_tool(handle, tool, act, slot, pending)

    async def _claimed(self, handle: RunHandle, lease: Lease, exc: Claimed) -> tuple[bool, int]:
        """The ledger knows a key the log does not: never send it blindly."""
        self.redis.hincrby(keys.STATS, "duplicates_suppressed", 1)
        counters.incr(self.redis, counters.DUPLICATES)
        fresh = self._load(handle.run_id, lease)
        if fresh is not None:
            await self._quarantine(fresh, f"key {exc.key} is claimed in the ledger "
                                   f"({exc.value}) but the log has no dispatch for it")
        return True, 0

    async def _decide_group(self, handle: RunHandle, agent: Agent, slot: Slot,
                            pending: list[Spec], lease: Lease,
                            decision: Parallel) -> tuple[bool, int]:
        """Several calls decided at once (``workers.parallel``): intents, claims and
        dispatches in one commit, then every call at once."""
        state, run_id = handle.state, handle.run_id
        try:
            group = parallel.check_group(agent, self.registry, state, decision,
                                         self.settings.max_payload_bytes,
                                         self.settings.action_window)
        except (UnknownTool, ValueError, TypeError) as exc:
            await self._commit(handle, pending, [])
            await self._quarantine(handle, f"steps from {state.step + 1}: {exc}")
            return True, 0
        why = parallel.exhausted(state, group)
        if why is not None:
            await self._commit(handle, pending, [Spec(ev.Failed, {
                "error": f"{budgets.REASON}: {why}", "reason": budgets.REASON})])
            self.redis.hincrby(keys.STATS, "budgets_exhausted", 1)
            return True, 0
        for step, args in zip(group.steps, group.args, strict=True):
            handle.live_args[step] = args
        decided = parallel.intents(run_id, group, decision.values)
        if state.cancel is not None:  # call-scoped cancel pending: record, never send
            reason = state.cancel.reason
            await self._commit(handle, pending, [*decided, *[Spec(ev.CallCanceled, {
                "step": s, "key": step_key(run_id, s), "reason": reason})
                for s in group.steps]])
            return False, len(group.steps)
        sent, ledger = parallel.dispatches(run_id, group)
        try:
            await self._commit(handle, pending, [*decided, *sent], ledger=ledger,
                               dispatch=True)
        except Claimed as exc:
            return await self._claimed(handle, lease, exc)
        self.hooks.after_outcome(run_id, group.steps[0] - 1)
        for step in group.steps:
            self.hooks.after_intent(run_id, step)
        calls = [(tool, handle.state.actions[step])
                 for step, tool in zip(group.steps, group.tools, strict=True)]
        return await self._run_group(handle, calls, slot, pending)

    async def _run_group(self, handle: RunHandle, calls: list[tuple[Tool, Action]],
                         slot: Slot, pending: list[Spec]) -> tuple[bool, int]:
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
                    self.log.commit(handle, spec)
                except (ConflictError, CancelPending, LeaseLost, Terminal,
                        redis.RedisError) as exc:
                    refused.append(exc)
                    held.extend(spec)
                    return
                self.hooks.after_outcome(run_id, step)

        def one(tool: Tool, act: Action) -> list[Spec]:
            began = time.monotonic()
            with tracing.step_span(run_id, agent_name, act.tool, act.key, act.step,
                                   act.attempts) as span:
                spec = self.dispatcher.dispatch(run_id, tool, act, slot.token,
                                                handle.live_args.get(act.step, act.args))
                outcome = counters.OUTCOMES.get(spec[0].cls, spec[0].cls.__name__) \
                    if spec else ""
                span.outcome(outcome)
            self.hooks.after_effect(run_id, act.step)
            self.hooks.step_done(act.tool, outcome, time.monotonic() - began)
            record(act.step, spec)
            return spec

        def run_all() -> list[list[Spec]]:
            with self._outside():
                slot.in_call = True
                try:
                    return parallel.run_at_once(calls, one)
                finally:
                    slot.in_call = False

        await Offload(WAITING, run_all)
        if slot.token.cancelled and slot.token.reason == "lease lost":
            raise LeaseLost(run_id, Lease(run_id, handle.lease or "|-1").epoch)
        if slot.token.cancelled:
            slot.token = CancelToken()
        if refused:  # the loop reloads, then stages the outcomes not in the log yet
            pending[:] = held
            raise refused[0]
        return False, len(calls)

    def _unsigned_rejection(self, handle: RunHandle) -> str | None:
        """A rejection or an operator's settle the fold already applied must have been
        valid when it was made; one that was not (written around the client) is never fed
        to the agent: the run is quarantined. Approvals are checked at the gate."""
        for appr in handle.state.approvals.values():
            if appr.decision is not None and appr.decision != "approve":
                problem = check_history(self.approvers, handle.run_id, appr)
                if problem is not None:
                    return f"the rejection of {appr.request} does not hold: {problem}"
        return unsigned_settle(self.approvers, self.settings.settle_role, handle.state)

    def _approval_check(self, run_id: str) -> Check:
        """How this worker checks a recorded decision: against the approver registry, now."""
        return lambda appr: check_recorded(self.approvers, run_id, appr)

    async def _approval(self, handle: RunHandle, tool: Tool, act: Action,
                  pending: list[Spec]) -> tuple[bool, int] | None:
        """None when ``act`` may be dispatched now; else ask for an approval and stop.

        The digest needs the tool's facts, read now: if they cannot be read, the intent is
        kept and the run is looked at again shortly.
        """
        def facts() -> list[Spec] | None:
            verdict, reason = gate(handle.state, tool, act,
                                   self._approval_check(handle.run_id))
            return None if verdict == "go" else request_specs(handle.state, tool, act, reason)

        try:
            specs = await self._user(f"{tool.name}'s approval facts", facts)
            if specs is None:
                return None
        except Exception as exc:
            log.warning("run %s: approval facts of %s unavailable: %r", handle.run_id,
                        tool.name, exc)
            if handle.staged:
                await self._commit(handle, pending, [])
            self.redis.zadd(keys.due_of(handle.run_id), {handle.run_id: now_ms() + LOOKUP_RETRY_MS})
            return True, 0
        await self._commit(handle, pending, specs, checkpoint=True)
        return True, 0

    async def _run_tool(self, handle: RunHandle, tool: Tool, act: Action, slot: Slot,
                  pending: list[Spec]) -> tuple[bool, int]:
        args = handle.live_args.get(act.step, act.args)
        if is_placeholder(args):
            await self._commit(handle, pending, [])
            await self._quarantine(handle, f"step {act.step} ({act.tool}): its arguments were "
                                           "kept out of the log and the agent did not give "
                                           "them again")
            return True, 0
        began = time.monotonic()
        with tracing.step_span(handle.run_id, handle.state.agent, act.tool, act.key, act.step,
                               act.attempts) as span:
            def call() -> list[Spec]:
                with self._outside():
                    slot.thread_id, slot.in_call = threading.get_ident(), True
                    try:
                        return self.dispatcher.dispatch(handle.run_id, tool, act, slot.token,
                                                        args)
                    finally:
                        slot.in_call = False

            spec: list[Spec] = await Offload(act.tool, call)
            outcome = counters.OUTCOMES.get(spec[0].cls, spec[0].cls.__name__) if spec else ""
            span.outcome(outcome)
        self.hooks.after_effect(handle.run_id, act.step)
        self.hooks.step_done(act.tool, outcome, time.monotonic() - began)
        return await self._outcomes(handle, slot, pending, spec, 1)

    async def _outcomes(self, handle: RunHandle, slot: Slot, pending: list[Spec],
                        specs: list[Spec], steps: int) -> tuple[bool, int]:
        """Stage the outcomes of ``steps`` calls just made; commit them at once when the
        run must stop for them (a wait, an unknown outcome, a cancel)."""
        if slot.token.cancelled and slot.token.reason == "lease lost":
            raise LeaseLost(handle.run_id, Lease(handle.run_id, handle.lease or "|-1").epoch)
        if slot.token.cancelled:
            slot.token = CancelToken()
        pending[:] = specs
        self.log.stage(handle, specs)
        if handle.state.waiting or handle.state.state == "outcome_unknown" or (
            handle.state.cancel is not None
        ):
            await self._commit(handle, pending, [])
            self.hooks.after_outcome(handle.run_id, handle.state.step)
        return False, steps

    async def _finish_cancel(self, handle: RunHandle, pending: list[Spec]) -> None:
        cancel = handle.state.cancel
        assert cancel is not None
        specs = finish_specs(handle.state, cancel.reason, cancel.requested_ts)
        await self._commit(handle, pending, specs)
        self.redis.hset(keys.CANCEL_LATENCY, handle.run_id, specs[-1].fields["latency_ms"])
        cancel_children(self.log, self.redis, handle.state, cancel.reason, self.worker_id,
                        self.settings.cancel_secret)
