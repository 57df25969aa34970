"""The client API: the one door to run state for producers, operators and auditors."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import redis
import redis.asyncio
from pydantic import ValidationError

from durable import catalog
from durable.agents import Registry, registry
from durable.answers import decide_approval, respond
from durable.approvals import Approvers, sign_decision
from durable.budgets import checked as checked_budgets
from durable.cancellation import CancelMessage, encode_message, finish_specs
from durable.connection import connect
from durable.errors import (
    ConflictError,
    DecodeError,
    InvalidInput,
    PayloadTooLarge,
    Refused,
    RunIdConflict,
    RunNotFound,
    Terminal,
    UnknownAgent,
    UsageError,
)
from durable.log import events as ev
from durable.log import keys
from durable.log.state import TERMINAL, WAITING, RunState
from durable.log.store import Entry, EventLog, RunHandle, Spec, now_ms
from durable.quarantine import release
from durable.queue import enqueue_advance, make_queue
from durable.settings import Settings
from durable.streaming import Follower, Partial, afollow, async_twin


@dataclass(frozen=True)
class Started:
    run_id: str
    created: bool
    state: str


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    state: str
    agent: str
    step: int
    version: int
    updated: int
    reason: str = ""


class Client:
    def __init__(self, settings: Settings | None = None, client: redis.Redis | None = None,
                 agents: Registry | None = None) -> None:
        self.settings = settings or Settings()
        self.redis = client if client is not None else connect(self.settings)
        self.registry = agents or registry
        self.registry.load(self.settings.agents)
        self.log = EventLog.from_settings(self.redis, self.settings)
        self.queue = make_queue(self.redis, self.settings.queue)
        #: The approver registry (``durable approvers``).
        self.approvers = Approvers(self.redis)
        #: Agents this client published to the catalog already.
        self._published: set[str] = set()

    # Producers ---------------------------------------------------------------------------

    def start(self, agent: str, input: Any = None, run_id: str | None = None,
              *, enqueue: bool = True, budgets: Mapping[str, int] | None = None) -> Started:
        """Start a run; the same ``run_id`` with the same agent and input returns the
        existing run, writing nothing; with another agent or input it raises
        ``RunIdConflict``.

        An agent this process imports is validated with its input model (and published to
        the catalog if no one has); any other is looked up in the catalog workers publish
        (``durable.catalog``), its input checked against the published JSON schema, and the
        run records the published version.

        ``budgets`` override the agent's limits ("steps", "model_calls", "tokens") for this
        run; they are recorded in its log."""
        if run_id is None:
            run_id = uuid.uuid4().hex[:16]
        if not keys.RUN_ID_RE.match(run_id):
            raise UsageError(f"invalid run id {run_id!r}: use 1-128 of A-Z a-z 0-9 _ . : -")
        name, version, tools, defaults, data = self._checked_input(agent, input)
        limits = checked_budgets({**defaults, **(budgets or {})})
        size = len(msgspec.msgpack.encode(data))
        if size > self.settings.max_payload_bytes:
            raise PayloadTooLarge("input", size, self.settings.max_payload_bytes)
        if self.log.projection(run_id):
            return self._existing(run_id, name, data)
        handle = RunHandle(run_id, RunState(), actor="client")
        try:
            self.log.commit(handle, [Spec(ev.RunStarted, {
                "agent": name, "agent_version": version, "input": data,
                "tools": tools, "budgets": limits})],
                extra={"agent": name, "created": str(now_ms())})
        except ConflictError:
            return self._existing(run_id, name, data)
        if enqueue:
            enqueue_advance(self.redis, self.queue, run_id)
        return Started(run_id, True, handle.state.state)

    def _checked_input(self, agent: str,
                       input: Any) -> tuple[str, str, list[str], dict[str, int], Any]:
        """(name, version, tools, budgets, input as the run records it), or a
        ``UsageError``."""
        data = input if input is not None else {}
        try:
            spec = self.registry.agent(agent)
        except UnknownAgent:
            found = catalog.published(self.redis, agent)
            if found is None:
                known = sorted(set(self.registry.agents) | set(catalog.names(self.redis)))
                raise UnknownAgent(agent, known, "no worker has registered it") from None
            return (found.name, found.version, list(found.tools), dict(found.budgets),
                    catalog.validate(found, data))
        try:
            model = spec.input_model.model_validate(data)
        except ValidationError as exc:
            msg = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidInput(agent, msg) from None
        if spec.name not in self._published:
            catalog.publish(self.redis, [spec], catalog.producer_id(), replace=False)
            self._published.add(spec.name)
        return (spec.name, spec.version, list(spec.tools), dict(spec.budgets),
                model.model_dump(mode="json"))

    def _existing(self, run_id: str, agent: str, data: Any) -> Started:
        """The run already started under ``run_id``, if it was started with this agent and
        input; else ``RunIdConflict``."""
        first = self.log.read(run_id, "-", "+", count=1)
        started = first[0].event if first else None
        if not isinstance(started, ev.RunStarted):
            raise RunIdConflict(run_id, "a log that does not begin with run_started")
        if started.agent != agent:
            raise RunIdConflict(run_id, f"agent {started.agent!r}, not {agent!r}")
        if _canonical(started.input) != _canonical(data):
            raise RunIdConflict(run_id, "a different input")
        return Started(run_id, False, self.log.projection(run_id).get("state", "?"))

    def enqueue(self, run_id: str, *, force: bool = False) -> bool:
        return enqueue_advance(self.redis, self.queue, run_id, force=force)

    # Reading -----------------------------------------------------------------------------

    def status(self, run_id: str) -> RunState:
        """The folded state (from the last checkpoint). An unreadable log quarantines."""
        try:
            return self.log.load(run_id, actor="client").state
        except DecodeError as exc:
            reason = f"unreadable log entry {exc.entry_id}: {exc.reason}"
            self.log.quarantine(run_id, reason, "client")
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
             after: str | None = None) -> list[RunSummary]:
        """Runs by update time, newest first: in ``state``, of ``agent``; ``after`` a run id
        of the previous page (the next page starts below it)."""
        index = keys.runs_in_state(state) if state else keys.RUNS_BY_UPDATE
        start = 0
        if after is not None:
            rank = self.redis.zrevrank(index, after)
            if rank is None:
                raise RunNotFound(after)
            start = rank + 1
        out: list[RunSummary] = []
        batch = max(limit, 100)
        while len(out) < limit:
            ids = [i.decode() for i in self.redis.zrevrange(index, start, start + batch - 1)]
            if not ids:
                break
            start += len(ids)
            pipe = self.redis.pipeline(transaction=False)
            for rid in ids:
                pipe.hgetall(keys.run(rid))
            for rid, raw in zip(ids, pipe.execute(), strict=True):
                p = {k.decode(): v.decode() for k, v in raw.items()}
                if not p or (state and p.get("state") != state) or \
                        (agent and p.get("agent") != agent):
                    continue
                out.append(RunSummary(rid, p.get("state", "?"), p.get("agent", ""),
                                      int(p.get("step", 0)), int(p.get("version", 0)),
                                      int(p.get("updated", 0)), p.get("reason", "")))
                if len(out) == limit:
                    break
        return out

    def wait(self, run_id: str, timeout: float = 30.0, *, waiting: bool = True) -> RunState:
        """Block until the run is terminal (or waiting, or quarantined); raise TimeoutError."""
        stop = frozenset(TERMINAL | ({"quarantined"} | (WAITING if waiting else frozenset())))
        end = time.monotonic() + timeout
        delay = 0.005
        while True:
            state = self.redis.hget(keys.run(run_id), "state")
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
        (``Partial``) while following. It ends after a terminal event; ``close()`` stops it
        earlier. ``from_id``: yield only entries after this id ("0": all of them; the last
        ``Entry.id`` seen: resume). Raises ``RunNotFound``."""
        return Follower(self.redis, run_id, after=from_id, partial=partial,
                        reconnect_s=self.settings.connect_timeout_s)

    def afollow(self, run_id: str, *, from_id: str = "0", partial: bool = True,
                client: redis.asyncio.Redis | None = None) -> AsyncIterator[Entry | Partial]:
        """``follow`` as an async iterator (``redis.asyncio``; ``client``: use this one
        instead of a new client for the same server). ``RunNotFound`` is raised on first
        iteration."""
        return afollow(client or async_twin(self.redis), run_id, after=from_id,
                       partial=partial, reconnect_s=self.settings.connect_timeout_s,
                       close_client=client is None)

    def stats(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.redis.hgetall(keys.STATS).items()}

    # Operators ---------------------------------------------------------------------------

    def cancel(self, run_id: str, reason: str = "", scope: str = "run") -> RunState:
        """Record a cancel request (durable first), then publish the hint.

        A terminal run is left as it is. A run no worker holds, with nothing in flight, is
        canceled at once.
        """
        if scope not in ("run", "call"):
            raise UsageError(f"scope must be 'run' or 'call', not {scope!r}")
        requested = now_ms()
        for _ in range(20):
            handle = self._load(run_id)
            state = handle.state
            if state.terminal or (state.cancel is not None and state.cancel.scope == scope):
                return state
            request = Spec(ev.CancelRequested, {"reason": reason, "scope": scope,
                                                "requested_ts": requested, "by": "operator"})
            in_flight = any(a.status in ("dispatched", "unknown") for a in state.actions.values())
            now_specs = (finish_specs(state, reason, requested)
                         if scope == "run" and not in_flight else [])
            try:
                self.log.commit(handle, [request], if_free=now_specs)
            except ConflictError:
                continue
            except Terminal:
                return self.status(run_id)
            if handle.state.state == "canceled":
                self.redis.hset(keys.CANCEL_LATENCY, run_id, now_ms() - requested)
            self.redis.publish(keys.CANCEL_CHANNEL, encode_message(
                CancelMessage(run=run_id, reason=reason, scope=scope, ts=now_ms()),
                self.settings.cancel_secret))
            return handle.state
        raise ConflictError(run_id, -1, -1)

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
        state, resumed = respond(self.log, run_id, data, kind=kind, request=request, by=by)
        if resumed:
            self.enqueue(run_id)
        return state

    def approve(self, run_id: str, request: str, decision: str, approver: str,
                note: str = "", *, signature: str) -> RunState:
        """Record a decision signed by the registered approver key ``approver``
        (``durable.approvals.sign_decision`` over the run, the request, its digest, the
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

    def release(self, run_id: str, by: str = "operator") -> str:
        """Retry a quarantined run with the current code; returns its state afterwards."""
        return release(self, run_id, by=by)

    def _load(self, run_id: str) -> RunHandle:
        try:
            return self.log.load(run_id, actor="operator")
        except DecodeError as exc:
            self.log.quarantine(run_id, f"unreadable log entry {exc.entry_id}: {exc.reason}")
            raise


def _canonical(data: Any) -> bytes:
    return msgspec.json.encode(data, order="sorted")
