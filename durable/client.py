"""The client API: the one door to run state for producers, operators and auditors."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio

from durable import catalog
from durable.agents import Registry, registry
from durable.audit.forks import fork
from durable.audit.replay import check_entry_id, state_at
from durable.audit.seals import check_sealer
from durable.backend.cancel_messages import CancelMessage, encode_message
from durable.backend.connection import connect, connect_queue
from durable.contention import update_run
from durable.controls import sessions, settling
from durable.controls.answers import decide_approval, respond
from durable.controls.approvals import sign_decision
from durable.controls.approvers import Approvers
from durable.controls.cancellation import cancel_children, finish_specs
from durable.controls.compensation import Compensations
from durable.controls.quarantine import release
from durable.controls.schedules import Schedules
from durable.controls.starts import Starts
from durable.errors import DecodeError, Refused, RunNotFound, Terminal, UnknownAgent, UsageError
from durable.flow import tenants
from durable.log import counters, keys
from durable.log import events as ev
from durable.log.index import RunSummary as RunSummary
from durable.log.index import ordered, run_summary
from durable.log.state import TERMINAL, WAITING, Action, RunState
from durable.log.store import Entry, EventLog, RunHandle, Spec, now_ms
from durable.outcomes import NO_LOOKUP
from durable.security.sealing import contains_sensitive, seal_fields
from durable.settings import Settings
from durable.streams.streaming import Follower, Partial, afollow, async_twin
from durable.telemetry import orphans, overview


class Client(Starts, Compensations):
    """Producers start runs (``durable.controls.starts.Starts``), readers follow and audit them,
    operators act on them: every read and write of run state goes through here."""

    def __init__(self, settings: Settings | None = None, client: redis.Redis | None = None,
                 agents: Registry | None = None) -> None:
        self.settings = settings or Settings()
        self._owned: list[redis.Redis] = []
        self.redis = client if client is not None else connect(self.settings)
        if client is None:
            self._owned.append(self.redis)
        self.registry = agents or registry
        self.registry.load(self.settings.worker.agents)
        self.log = EventLog.from_settings(self.redis, self.settings,
                                          lean_agents=self.registry.rebuilt_agents())
        self._queue_client = connect_queue(self.settings, self.redis)  # RQ's server, checked
        if self._queue_client is not self.redis:
            self._owned.append(self._queue_client)
        #: The approver registry (``durable approvers``).
        self.approvers = Approvers(self.redis, self.log.admin_keys)
        check_sealer(self.approvers, self.log.sealer)  # a seal no one can verify: refused
        #: Schedules that start a run per slot (``durable schedule``).
        self.schedules = Schedules(self)
        #: Agents this client published to the catalog already.
        self._published: set[str] = set()
        #: Bounded tenant labels of the metrics (``durable.flow.tenants``).
        self.tenant_labels = tenants.Labels(self.redis, self.settings.tenants.in_metrics)

    def close(self) -> None:
        """Close the connections this client opened (not one it was given)."""
        for owned in self._owned:
            owned.close()
        self._owned = []

    # Reading -----------------------------------------------------------------------------

    def status(self, run_id: str) -> RunState:
        """The folded state (from the last checkpoint). An unreadable log quarantines."""
        try:
            return self.log.load(run_id, actor="client").state
        except DecodeError as exc:
            reason = f"unreadable log entry {exc.entry_id}: {exc.reason}"
            self.log.quarantine(run_id, reason, "client", counters.migration_error(exc.reason))
            proj = self.log.projection(run_id)
            return RunState(run_id=run_id, state=proj.get("state", "quarantined"),
                            version=int(proj.get("version", 0)), reason=proj.get("reason"),
                            agent=proj.get("agent", ""))

    def projection(self, run_id: str) -> dict[str, str]:
        proj = self.log.projection(run_id)
        if not proj:
            raise RunNotFound(run_id)
        return proj

    def events(self, run_id: str, start: str = "-", end: str = "+") -> list[Entry]:
        if not self.log.exists(run_id):
            raise RunNotFound(run_id)
        return self.log.read(run_id, start, end)

    def runs(self, state: str | None = None, limit: int = 100, *, agent: str | None = None,
             after: str | None = None, since: int | None = None,
             oldest_first: bool = False, tenant: str | None = None,
             owner: str | None = None, session: str | None = None) -> list[RunSummary]:
        """Runs by update time, newest first (or ``oldest_first``): in ``state``, of
        ``agent``, updated at or after ``since`` (ms since the epoch); ``after`` a run id
        of the previous page (the next page starts below it). With ``tenant``: that
        tenant's runs only, by start time (its index); ``owner``: started by that owner.
        With ``session``: the runs of that session (of ``tenant``), the latest turn first
        (``durable.controls.sessions``)."""
        if oldest_first and since is not None:
            raise UsageError("since and oldest_first cannot be combined")
        if session is not None and (oldest_first or since is not None):
            raise UsageError("a session's runs are listed by turn, latest first: "
                             "without since or oldest_first")
        walk = sessions.walk(self.redis, tenant or "", sessions.checked(session), after) \
            if session is not None else \
            ordered(self.redis, self.log.keys, state, after, oldest_first=oldest_first,
                    tenant=tenant)
        out: list[RunSummary] = []
        batch = max(limit, 100)
        while len(out) < limit:
            scored = list(itertools.islice(walk, batch))
            page = [rid for rid, score in scored if since is None or score >= since]
            if not page:
                break
            pipe = self.redis.pipeline(transaction=False)
            for rid in page:
                pipe.hgetall(self.log.keys.run(rid))
            for rid, raw in zip(page, pipe.execute(), strict=True):
                p = {k.decode(): v.decode() for k, v in raw.items()}
                if not p or (state and p.get("state") != state) or \
                        (agent and p.get("agent") != agent) or \
                        (tenant and p.get("tenant") != tenant) or \
                        (owner and p.get("owner") != owner):
                    continue
                out.append(run_summary(rid, p))
                if len(out) == limit:
                    break
            if len(page) < len(scored):
                break  # the rest were updated before ``since``
        return out

    def search(self, text: str, limit: int = 50) -> list[RunSummary]:
        """Runs whose id contains ``text``, newest first (a ``ZSCAN`` of the index: its
        cost grows with the number of runs)."""
        if not keys.RUN_ID_RE.match(text):
            raise UsageError(f"search {text!r}: a run id has only A-Z a-z 0-9 _ . : -")
        found = [(score, rid.decode()) for shard in self.log.keys.shard_ids() for rid, score in
                 self.redis.zscan_iter(self.log.keys.runs_index(shard), match=f"*{text}*",
                                       count=1000)]
        out = []
        for _score, rid in sorted(found, reverse=True)[:limit]:
            p = self.log.projection(rid)
            if p:
                out.append(run_summary(rid, p))
        return out

    def counts(self) -> dict[str, int]:
        """Runs per state (from the state indexes)."""
        return overview.counts(self.redis, self.log.keys)

    def state_at(self, run_id: str, entry_id: str = "+") -> tuple[RunState, str]:
        """The folded state at ``entry_id`` (inclusive), from the nearest checkpoint at or
        before it, and that checkpoint's id ("" = from the start), as ``durable replay
        --to``."""
        check_entry_id(entry_id, "+")
        return state_at(self.log, run_id, entry_id)

    def ledger(self, run_id: str) -> dict[str, str]:
        """The run's action ledger: idempotency key -> ``claimed|<deadline>`` or
        ``done|<outcome>``."""
        raw = self.redis.hgetall(self.log.keys.ledger(run_id))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def lease(self, run_id: str) -> overview.LeaseInfo | None:
        """Who holds the run now, and how long ago its lease was renewed (None: nobody)."""
        return overview.lease(self.redis, self.log.keys, run_id, self.settings.leases.ttl_ms)

    def leases(self) -> list[overview.LeaseInfo]:
        """Every lease held now (a ``SCAN``: for operators' pages)."""
        return overview.leases(self.redis, self.log.keys, self.settings.leases.ttl_ms)

    def workers(self) -> list[overview.WorkerInfo]:
        """The live worker processes, each with the runs it holds."""
        return overview.workers(self.redis, self.queue, self.leases())

    def queue_depth(self) -> dict[str, int]:
        return overview.queue_depth(self.redis, self.log.keys, self.queue)

    def orphaned(self, limit: int | None = None, *, now: int | None = None) -> list[orphans.Orphan]:
        """Runs not over that nothing will move on (``durable.telemetry.orphans``)."""
        return orphans.find(self.log, self.queue, now=now, limit=limit,
                            grace=orphans.grace_ms(self.settings))

    def sweeps(self) -> list[overview.Sweep]:
        """Each reconciler's last sweep and what its last busy sweep did."""
        return overview.sweeps(self.redis)

    def wait(self, run_id: str, timeout: float = 30.0, *, waiting: bool = True) -> RunState:
        """Block until the run is terminal (or waiting, or quarantined); raise TimeoutError."""
        stop = frozenset(TERMINAL | ({"quarantined"} | (WAITING if waiting else frozenset())))
        end = time.monotonic() + timeout
        delay = 0.005
        while True:
            state = self.redis.hget(self.log.keys.run(run_id), "state")
            if state is None:
                raise RunNotFound(run_id)
            if state.decode() in stop:
                return self.status(run_id)
            if time.monotonic() > end:
                raise TimeoutError(f"run {run_id} is still {state.decode()} after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.1)

    def follow(self, run_id: str, *, from_id: str = "0", partial: bool = True) -> Follower:
        """Follow a run: a sync iterator of its log events in order (``Entry``: ``id``,
        ``event``), interleaved with the partial outputs its steps emit as they arrive
        (``Partial``) while following; joining mid-step, first what the steps in flight
        said so far (``durable.streams.partials``). It ends after a terminal event; ``close()``
        stops it earlier. ``from_id``: yield only entries after this id ("0": all of them; the last
        ``Entry.id`` seen: resume). Raises ``RunNotFound``."""
        return Follower(self.redis, self.log.keys, run_id, after=from_id, partial=partial,
                        reconnect_s=self.settings.redis.connect_timeout_s)

    def afollow(self, run_id: str, *, from_id: str = "0", partial: bool = True,
                client: redis.asyncio.Redis | None = None) -> AsyncIterator[Entry | Partial]:
        """``follow`` as an async iterator (``redis.asyncio``; ``client``: use this one
        instead of a new client for the same server). ``RunNotFound`` is raised on first
        iteration."""
        return afollow(client or async_twin(self.redis), self.log.keys, run_id, after=from_id,
                       partial=partial, reconnect_s=self.settings.redis.connect_timeout_s,
                       close_client=client is None)

    def stats(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.redis.hgetall(keys.STATS).items()}

    # Operators ---------------------------------------------------------------------------

    def cancel(self, run_id: str, reason: str = "", scope: str = "run",
               by: str = "operator", *, compensate: bool = False) -> RunState:
        """Record a cancel request (durable first), then publish the hint.

        A terminal run is left as it is. A run no worker holds, with nothing in flight, is
        canceled at once; so is a quarantined run, whatever it had in flight (a dispatched
        call is recorded interrupted: its ``lookup`` is asked later). ``by``: who asked
        (the request's ``by`` and actor). ``compensate``: ``abort`` (its effects undone).
        """
        if compensate:
            return self.abort(run_id, reason, by=by).state
        if scope not in ("run", "call"):
            raise UsageError(f"scope must be 'run' or 'call', not {scope!r}")
        requested = now_ms()

        def write(handle: RunHandle) -> tuple[RunState, bool, bool]:
            state = handle.state
            if state.terminal or (state.cancel is not None and state.cancel.scope == scope):
                return state, False, False
            request = Spec(ev.CancelRequested, {"reason": reason, "scope": scope,
                                                "requested_ts": requested, "by": by})
            in_flight = any(a.status in ("dispatched", "unknown") for a in state.actions.values())
            # No worker drives a quarantined run: only this (or the reconciler) ends it.
            quarantined = state.state == "quarantined"
            at_once = not in_flight or quarantined
            now_specs = finish_specs(state, reason, requested) if scope == "run" and at_once \
                else []
            try:
                self.log.commit(handle, [request], if_free=now_specs)
            except Terminal:
                return self.status(run_id), False, False
            return handle.state, True, quarantined

        state, written, quarantined = update_run(self.log, run_id, by, write, load=self._load)
        if not written:
            return state
        if state.state == "canceled":
            self.redis.hset(keys.CANCEL_LATENCY, run_id, now_ms() - requested)
            if quarantined:
                self.redis.hdel(keys.QUARANTINE, run_id)
        if scope == "run" and state.children:  # scope run includes them
            cancel_children(self.log, self.redis, state, reason, by,
                            self.settings.cancel.secret)
        self.redis.publish(keys.CANCEL_CHANNEL, encode_message(
            CancelMessage(run=run_id, reason=reason, scope=scope, ts=now_ms()),
            self.settings.cancel.secret))
        return state

    def respond(self, run_id: str, response: Any, *, request: str | None = None,
                by: str = "operator") -> RunState:
        """Answer a run waiting for input; a late duplicate changes nothing."""
        return self._resume(run_id, response, "input", request, by)

    def external_event(self, run_id: str, data: Any, *, request: str | None = None,
                       by: str = "external") -> RunState:
        """Deliver the external event a ``waiting_external`` run waits for."""
        return self._resume(run_id, data, "external", request, by)

    def _resume(self, run_id: str, data: Any, kind: str, request: str | None,
                by: str) -> RunState:
        data = self._sealed_answer(run_id, data)
        state, resumed = respond(self.log, run_id, data, kind=kind, request=request, by=by)
        if resumed:
            self.enqueue(run_id)
        return state

    def _sealed_answer(self, run_id: str, data: Any) -> Any:
        """An answer to a waiting run, with the fields its agent marks sensitive sealed
        (refused without keys, nothing written)."""
        agent = self.log.projection(run_id).get("agent", "")
        try:
            names = self.registry.agent(agent).sensitive_input()
        except UnknownAgent:
            found = catalog.published(self.redis, agent)
            names = found.sensitive if found is not None else ()
        if not names or not contains_sensitive(data, names):
            return data
        if not self.log.keyring:
            raise UsageError(f"agent {agent!r} marks {', '.join(names)} sensitive: set "
                             "DURABLE_ENCRYPTION_KEYS to answer it (nothing was written)")
        return seal_fields(data, names, self.log.keyring)

    def approve(self, run_id: str, request: str, decision: str, approver: str,
                note: str = "", *, signature: str) -> RunState:
        """Record a decision signed by the registered approver key ``approver``
        (``durable.controls.approvals.sign_decision`` over the run, the request, its digest, the
        decision and its expiry). The signature, the key (registered, not revoked), its
        role, the request (open, not expired) and the decision are checked first; a refused
        decision raises ``Refused`` and writes nothing."""
        state, written = decide_approval(self.log, self.approvers, run_id, request, decision,
                                         approver, signature, note)
        if written and not (state.terminal or state.waiting):
            self.enqueue(run_id)
        return state

    def sign_and_approve(self, run_id: str, request: str, decision: str, approver: str,
                         private_key_pem: bytes, note: str = "") -> RunState:
        """Sign ``decision`` on ``request`` as it is recorded now with ``private_key_pem``
        (the key ``approver`` registered), then ``approve``: what a CLI or a console does
        for a logged-in approver whose key file it holds."""
        appr = self.status(run_id).approvals.get(request)
        if appr is None:
            raise Refused(run_id, f"no approval request {request!r}")
        signature = sign_decision(private_key_pem, run_id, request, appr.digest, decision,
                                  appr.expires)
        return self.approve(run_id, request, decision, approver, note, signature=signature)

    def settle(self, run_id: str, step: int, resolution: str, *, evidence: str, signer: str,
               signature: str, result: Any = None) -> RunState:
        """Record an operator's signed decision that ``step``'s unknown outcome was
        ``applied`` (with ``result``) or ``not_applied`` (``durable.controls.settling``), and
        let the run go on. Refused (``Refused``, nothing written) unless the step is unknown and
        the signature is ``signer``'s registered key's, with ``DURABLE_SETTLE_ROLE``."""
        state = settling.settle(self.log, self.approvers,
                                self.settings.security.settle_role, run_id,
                                step, resolution, result, evidence, signer, signature,
                                max_bytes=self.settings.payloads.max_payload_bytes)
        if not (state.terminal or state.waiting):
            self.enqueue(run_id)
        return state

    def sign_and_settle(self, run_id: str, step: int, resolution: str, signer: str,
                        private_key_pem: bytes, *, evidence: str,
                        result: Any = None) -> RunState:
        """Sign a settle of ``step`` as it is recorded now with ``private_key_pem`` (the key
        ``signer`` registered), then ``settle``."""
        act = self.status(run_id).actions.get(step)
        if act is None:
            raise Refused(run_id, f"step {step} is not a step of this run")
        signature = settling.sign_settle(private_key_pem, run_id, act, resolution, result,
                                         evidence)
        return self.settle(run_id, step, resolution, evidence=evidence, signer=signer,
                           signature=signature, result=result)

    def stuck(self, limit: int = 100) -> list[tuple[RunSummary, Action]]:
        """Runs whose unknown outcome no lookup can resolve, with that step: they wait for
        an operator's ``settle``. Newest first."""
        found: list[tuple[RunSummary, Action]] = []
        after: str | None = None
        while len(found) < limit:
            page = self.runs("waiting_external", 500, after=after)
            for row in page:
                if NO_LOOKUP in row.reason:
                    act = settling.waits_for_settle(self.status(row.run_id))
                    if act is not None:
                        found.append((row, act))
            if len(page) < 500:
                break
            after = page[-1].run_id
        return found[:limit]

    def release(self, run_id: str, by: str = "operator") -> str:
        """Retry a quarantined run with the current code; returns its state afterwards."""
        return release(self, run_id, by=by)

    def fork(self, run_id: str, at: str, new_run_id: str | None = None,
             by: str = "fork", *, overrides: dict[str, str] | None = None,
             hold_effects: bool = False, reuse_replies: bool = False) -> RunState:
        """Start a new run whose history is ``run_id``'s log up to entry ``at``
        (inclusive; a step number N: up to before step N), written with ``by`` as its
        actor, and make it ready. ``hold_effects`` (with ``overrides``, ``reuse_replies``):
        a counterfactual fork, every new effect held (``durable.audit.forks``)."""
        self.projection(run_id)
        check_entry_id(at)
        new_id = new_run_id or f"{run_id[:100]}-fork-{uuid.uuid4().hex[:6]}"
        if not keys.RUN_ID_RE.match(new_id):
            raise UsageError(f"invalid run id {new_id!r}: use 1-128 of A-Z a-z 0-9 _ . : -")
        handle = fork(self.log, run_id, at, new_id, by=by, overrides=overrides,
                      hold_effects=hold_effects, reuse_replies=reuse_replies)
        self.enqueue(new_id)
        return handle.state

    def reconcile_soon(self, run_id: str) -> None:
        """Make the run due in the reconciler's due-set now: the next sweep of a running
        ``durable reconciler`` looks at it (a held run is left to its holder)."""
        self.projection(run_id)
        self.redis.zadd(self.log.keys.due_of(run_id), {run_id: now_ms()})

    def _load(self, run_id: str, actor: str = "operator") -> RunHandle:
        try:
            return self.log.load(run_id, actor=actor)
        except DecodeError as exc:
            self.log.quarantine(run_id, f"unreadable log entry {exc.entry_id}: {exc.reason}",
                                counts=counters.migration_error(exc.reason))
            raise
