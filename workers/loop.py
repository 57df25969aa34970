"""The step protocol, as run by a worker holding a run's lease.

For each step: the agent decides; the intent (step, tool, args, key) and the ledger claim of
its key are recorded in one script call; the effect is dispatched with the key and a
deadline; its outcome is staged and recorded together with the next step's intent (one
round trip per step). A claimed key with no outcome is *unknown* and is resolved with the
tool's ``lookup`` once the earlier dispatch's deadline has passed, before anything is sent
again. Every append checks the lease's fencing epoch: a worker that lost its lease writes
nothing and drops its work.

The protocol is a coroutine per held run that never blocks its driver: every Redis call
is awaited (``workers.redis_io``: batched with the other runs' calls), and so is all user
code (``workers.turns.Offload``). Here: taking a run, the loop over its steps, reloads
after a conflict, commits, quarantine. A job's checks before its first step are in
``workers.admission``, what a decision leads to in ``workers.decisions`` (both see the
loop as a ``workers.context.StepContext``); letting go of runs from outside their steps
(the watchdog, the hand-back) in ``workers.watchdog``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from durable.agents import Agent, Registry
from durable.audit.seals import check_sealer
from durable.backend.connection import connect_queue
from durable.backend.outages import Outage
from durable.code import CodeAgent
from durable.controls.approvers import Approvers
from durable.errors import (
    CancelPending,
    ChainBroken,
    ConflictError,
    DecodeError,
    LeaseLost,
    RegionFenced,
    RunNotFound,
    Terminal,
    UnknownAgent,
)
from durable.eventloop import EVENT_LOOP
from durable.flow.limits import Limiter
from durable.leases import Heartbeats, Lease, Leases
from durable.log import counters, keys, recovery
from durable.log import events as ev
from durable.log.batching import drive
from durable.log.keys import RUN_ID_RE
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec
from durable.queue import make_queue, make_ready
from durable.settings import Settings
from durable.telemetry import tracing

from . import admission, authority, compensation, decisions, family, open_calls
from .dispatch import Dispatcher
from .gates import revalidate
from .hooks import HookChain, StepHooks
from .redis_io import RedisIO
from .regions import RegionGate
from .steps import recorded
from .turns import (
    NO_CALLBACKS,
    SLOT,
    STEP_TURNS,
    DriverCallbacks,
    Offload,
    Outside,
    Slot,
    Turns,
    UserCode,
)
from .watchdog import Watchdog

log = logging.getLogger("durable.worker")

#: Events after which a job has nothing left to do: their batch also releases the lease.
_LAST_WRITES = (ev.Completed, ev.Failed, ev.Canceled, ev.Expired, ev.WaitEntered,
                ev.Quarantined)


@functools.cache
def _last_write(cls: type) -> bool:
    """Whether an event of ``cls`` ends a job's work (asked per class, not per event)."""
    return issubclass(cls, _LAST_WRITES)


class StepLoop:
    """Drives the runs this worker holds through the step protocol (see the module doc).

    ``on_restart``: called once too many tool calls are stuck (``workers.watchdog``).
    """

    def __init__(self, settings: Settings, client: redis.Redis, registry: Registry,
                 worker_id: str, queue_name: str | None = None,
                 hooks: StepHooks | None = None, *,
                 on_restart: Callable[[], object] = lambda: None) -> None:
        self.settings = settings
        self.redis = client
        self.registry = registry
        self.worker_id = worker_id
        # Agent and tool code runs here: sealed fields are opened when read, sealed when written.
        self.log = EventLog.from_settings(client, settings, open_sealed=True,
                                          sealed_names=registry.sensitive_names(),
                                          lean_agents=registry.rebuilt_agents())
        self.leases = Leases.of(client, settings, self.log.keys)
        #: Whether this worker's region owns the runs now (``workers.regions``).
        self.regions = RegionGate(client, self.log.keys, settings.cluster.region)
        # The run threads' appends and lease acquisitions go out together (the hub's on a
        # cluster and with DURABLE_MIN_REPLICAS too: ``workers.runtime.choose_driver``).
        self.leases.batcher = self.log.batch_appends(everywhere=settings.worker.driver == "hub")
        #: The approver registry: a decision is checked again before its call is sent.
        self.approvers = Approvers(client, self.log.admin_keys)
        if self.log.sealer is not None:  # it seals the runs it ends: with a registered key
            check_sealer(self.approvers, self.log.sealer)
        self.heartbeats = Heartbeats(self.leases)
        #: Leases let go by a job's last write (append.lua's "r" flag), by (run, lease
        #: value): a value "<worker>|<epoch>" repeats across runs whose epochs agree.
        self.released: set[tuple[str, str]] = set()
        #: RQ and the ready list: on DURABLE_QUEUE_URL's server, else the log's.
        self.queue = make_queue(connect_queue(settings, client),
                                queue_name or settings.worker.queue)
        #: Every Redis call of the protocol's coroutines.
        self.io = RedisIO(client, self.leases.batcher, self.leases, self.queue)
        self.held: dict[str, Slot] = {}
        #: Limits shared by every worker (``durable.flow.limits``); a release wakes a waiter.
        self.limiter = Limiter(client, wake=lambda run: make_ready(
            self.redis, self.log.keys, self.queue, run, force=True),
            batcher=self.leases.batcher, layout=self.log.keys)
        self.hooks = hooks or HookChain()
        self.outage = Outage(log)
        self.watchdog = Watchdog(settings, client, self.log, self.leases, self.heartbeats,
                                 self.queue, worker_id, self.held, self.outage,
                                 stuck_now=lambda: self.dispatcher.watch.stuck_now,
                                 on_restart=on_restart)
        self.dispatcher = Dispatcher.of(settings, on_stuck=self.watchdog.stuck_call)
        #: Threads whose run was abandoned (``Watchdog.abandoned_threads``).
        self.abandoned_threads = self.watchdog.abandoned_threads
        self.restart_requested = self.watchdog.restart_requested
        #: Turns for driving steps (``workers.turns.STEP_TURNS``).
        self.turns = Turns(STEP_TURNS)
        # Async agent code that blocks the event loop longer than agent code may run is
        # interrupted there (``durable.eventloop``).
        EVENT_LOOP.block_limit_s = settings.worker.decide_timeout_ms / 1000
        #: Set on shutdown: every run lets go at its next step boundary.
        self.stopping = threading.Event()
        #: Each agent's configuration, made once (``configuration``).
        self._configs: dict[str, dict[str, str]] = {}

    # Entry points -----------------------------------------------------------------------

    def advance(self, run_id: str, callbacks: DriverCallbacks = NO_CALLBACKS) -> dict[str, Any]:
        """Drive ``run_id`` on this thread (a run thread, or RQ's for an ``advance``
        command), its Redis calls batched with the other threads' (one of the step turns
        held meanwhile)."""
        with self.turns.inside():
            return drive(self.advance_async(run_id, callbacks))

    async def advance_async(self, run_id: str, callbacks: DriverCallbacks = NO_CALLBACKS
                            ) -> dict[str, Any]:
        """The step protocol for one held run, as a coroutine whose Redis calls and user
        code are awaited, run by whoever drives it: ``advance`` on a thread, or a worker's
        hub (``workers.hub``), which drives many at once from one thread. ``callbacks``:
        the driver's (``DriverCallbacks``)."""
        if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
            await self.io.stat("malformed_commands")  # nothing to drive, nothing to write
            log.error("refused a command naming run %r: not a valid run id", run_id)
            return {"refused": "invalid run id"}
        try:
            lease, version, raw = await self.leases.acquire_async(run_id, self.worker_id,
                                                                  take_queued=True)
        except RegionFenced as exc:  # nothing written or held: ready again, and a pause
            return await self.regions.fenced(exc, self.io)
        if lease is None:
            return {"run": run_id, "skipped": "lease held by another worker"}
        slot = Slot(lease, thread_id=threading.get_ident(), callbacks=callbacks)
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
            if (run_id, lease.value) in self.released:
                self.released.discard((run_id, lease.value))
            else:
                await self.io.release(lease)
        if more:
            await self.io.enqueue(run_id, route=slot.route)
        return {"run": run_id, "more": more}

    def hand_back(self) -> list[str]:
        """Let go of every held run at once (shutdown): ``Watchdog.hand_back``."""
        return self.watchdog.hand_back()

    def check_overruns(self, now: float | None = None) -> list[str]:
        """The watchdog's round (``Watchdog.check_overruns``)."""
        return self.watchdog.check_overruns(now)

    def user(self, what: str, fn: Callable[[], Any]) -> Offload:
        """Agent code ``fn`` for the current run, to ``await``: the watchdog times it on
        whichever thread runs it (and, on a run thread, its turn is given back)."""
        slot = SLOT.get()

        def timed() -> Any:
            with UserCode(self.turns, what, slot):
                return fn()

        return Offload(what, timed)

    def outside(self) -> Outside:
        """This thread waits on user code, a tool, or a deadline: give its turn back."""
        return self.turns.outside()

    def configuration(self, agent: Agent) -> dict[str, str]:
        """What a run's pin is compared with (``StepContext.configuration``)."""
        have = self._configs.get(agent.name)
        if have is None:
            have = self._configs[agent.name] = dict(agent.configuration(self.registry))
        return have

    # Reading a run ----------------------------------------------------------------------

    async def load(self, run_id: str, lease: Lease, version: int | None = None,
                   raw: Any = None) -> RunHandle | None:
        """The run folded (from the entries read with its lease, when given); None when it
        is gone, or unreadable (then quarantined)."""
        try:
            if version is not None:  # its chain checked against what was read with them
                return await self.io.fold(self.log, run_id, version, raw, lease=lease.value,
                                          actor=self.worker_id, tail=lease.tail)
            return await self.io.load(self.log, run_id, lease=lease.value,
                                      actor=self.worker_id)
        except DecodeError as exc:
            broken, why = isinstance(exc, ChainBroken), recovery.unreadable(exc)
            await self.io.quarantine_unread(self.log, run_id, why, self.worker_id, [
                *([] if broken else counters.migration_error(exc.reason)),  # (not a migration)
                *counters.resume_failure("chain_broken" if broken else "unreadable")])
        except RunNotFound:
            pass
        return None

    async def reload(self, handle: RunHandle, lease: Lease,
                     pending: list[Spec]) -> RunHandle | None:
        fresh = await self.load(handle.run_id, lease)
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

    # The loop -------------------------------------------------------------------------

    async def _drive(self, run_id: str, lease: Lease, slot: Slot, version: int, raw: Any) -> bool:
        """Run steps until the run stops needing this worker. True when work is left."""
        handle = await self.load(run_id, lease, version, raw)
        if handle is None or not needs_work(handle.state):
            return False
        slot.route = handle.state.agent
        try:
            agent = self.registry.agent(handle.state.agent)
        except UnknownAgent:
            # Taken from the shared list (made ready before routing): its agent's own list
            # is where a worker that has it takes it from.
            log.info("run %s: agent %s is not served here; put on its own ready list",
                     run_id, handle.state.agent)
            await admission.route(self, handle, lease, handle.state.agent)
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
        if not await admission.admit(self, handle, agent, lease, kept):
            return False
        # Outcomes observed but not yet in the log: they survive a reload after a conflict.
        pending: list[Spec] = []
        steps = conflicts = 0
        while True:
            try:
                if handle.state.resumed and needs_work(handle.state):
                    await self._revalidate(handle, agent, pending)
                    continue
                done, stepped = await self._step(handle, agent, slot, pending, lease)
                conflicts = 0
            except (ConflictError, CancelPending):
                conflicts += 1
                if conflicts > 100:  # someone keeps writing: let go, come back later
                    log.warning("run %s: too many conflicts; re-queued", run_id)
                    return True
                fresh = await self.reload(handle, lease, pending)
                if fresh is None:
                    return False
                handle = fresh
                forged = await authority.unsigned_rejection(self, handle)  # written meanwhile
                if forged is not None:
                    await self.quarantine(handle, forged)
                    return False
                continue
            except Terminal:
                return False
            steps += stepped
            if done:
                return False
            if steps >= self.settings.worker.steps_per_job or self.stopping.is_set():
                # Its turn is used up, or the worker is shutting down: let go at this step
                # boundary (the run goes back on the ready list).
                if handle.staged:
                    await self.commit(handle, pending, [])
                more = needs_work(handle.state)
                if more and not self.stopping.is_set():
                    slot.park_at = handle.state.version
                return more

    async def _revalidate(self, handle: RunHandle, agent: Agent, pending: list[Spec]) -> None:
        """Once per resume after a wait (``workers.gates.revalidate``): what only tells the
        agent goes out with its next step; what stops the run is committed now."""
        verdict, specs = await self.user(f"{agent.name}.revalidate()",
                                         lambda: revalidate(handle.state, agent, self.registry))
        if verdict == "ok":
            self.log.stage(handle, specs)
            handle.state.resumed = False  # checked once per resume
            return
        await self.commit(handle, pending, specs)
        if verdict == "quarantine":
            await self.io.hset(keys.QUARANTINE, handle.run_id, str(specs[0].fields["reason"]))

    async def commit(self, handle: RunHandle, pending: list[Spec], specs: list[Spec],
                     **kw: Any) -> None:
        """Commit what is staged plus ``specs``; once in the log, nothing is pending.

        A batch that ends the job's work (terminal, waiting) also lets go of the lease in the
        same script call.
        """
        release = not kw.get("if_free") and any(_last_write(s.cls) for s in specs)
        if release:
            slot = SLOT.get()
            if slot is not None:
                slot.callbacks.before_last_commit()
        sent = time.monotonic()
        await self.log.commit_async(handle, specs, release=release, **kw)
        pending.clear()
        if handle.lease and not release:  # the append renewed the lease (``Heartbeats``)
            self.heartbeats.written(handle.run_id, handle.lease, sent)
        if handle.state.terminal:  # its place under a run limit is free
            agent = self.registry.agents.get(handle.state.agent)
            if getattr(agent, "run_limits", ()):
                state = handle.state
                await self.io.elsewhere(lambda: self.limiter.release_run(state, agent))
        if release:
            self.released.add((handle.run_id, handle.lease))
            if handle.state.terminal and handle.state.parent_step:  # a child ended
                await self.woke(await family.wake_parent(self.io, self.log, handle.state,
                                                         self.worker_id))

    async def park(self, run_id: str, wait: Any) -> None:
        """The run waits for a limit (``durable.flow.limits``): due at its ``retry_at``, its
        reason shown; the worker lets go of it."""
        await self.io.look_again_at(run_id, wait.retry_at)
        await self.io.hset(self.log.keys.run(run_id), "reason", wait.reason)

    async def let_go(self, lease: Lease) -> None:
        """Release the job's ``lease`` before the job ends (its run goes elsewhere): the
        job's end (``advance_async``) does not release it again."""
        await self.io.release(lease)
        self.released.add((lease.run_id, lease.value))

    async def woke(self, parent: str | None) -> None:
        """Make a parent whose wait for a child was just resolved ready again."""
        if parent is not None:
            await self.io.enqueue(parent, force=True)

    async def quarantine(self, handle: RunHandle, reason: str, traceback: str = "",
                         counts: Sequence[tuple[str, int]] = ()) -> None:
        if traceback:
            log.error("run %s quarantined: %s\n%s", handle.run_id, reason, traceback.rstrip())
        else:
            log.error("run %s quarantined: %s", handle.run_id, reason)
        handle.staged = []
        handle.staged_counts = list(counts)  # not what the dropped events would have counted
        handle.state.version = handle.base_version  # their seqs are not taken: no gap
        fields: dict[str, Any] = {"reason": reason}
        if traceback:
            fields["traceback"] = traceback
        try:
            await self.log.commit_async(handle, [Spec(ev.Quarantined, fields)],
                                        extra={"reason": reason[:500]})
            await self.io.hset(keys.QUARANTINE, handle.run_id, reason[:500])
        except (ConflictError, Terminal, LeaseLost):
            await self.io.quarantine_unread(self.log, handle.run_id, reason, self.worker_id,
                                            counts)

    async def _step(
        self, handle: RunHandle, agent: Agent, slot: Slot, pending: list[Spec], lease: Lease
    ) -> tuple[bool, int]:
        """One pass: returns (stop, steps taken)."""
        state = handle.state
        if slot.token.cancelled and slot.token.reason == "lease lost":
            raise LeaseLost(handle.run_id, lease.epoch)
        if not needs_work(state):
            if handle.staged:
                await self.commit(handle, pending, [])
            return True, 0
        if state.cancel is not None and state.cancel.scope == "run":
            if state.cancel.compensate:  # its applied effects are undone first
                return await compensation.advance(self, handle, agent, slot, pending)
            await open_calls.finish_cancel(self, handle, pending)
            return True, 0
        act = state.current
        if act is None:
            return await decisions.decide(self, handle, agent, slot, pending, lease)
        return await open_calls.open_call(self, handle, agent, act, slot, pending)


def needs_work(state: RunState) -> bool:
    """Whether a worker has anything to do for a run in ``state``."""
    return not (state.terminal or state.waiting or state.state == "quarantined")
