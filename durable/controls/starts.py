"""Starting runs: ``Client.start`` and ``start_many``, and what each start checks before it
writes (the run id, the input against the agent, budgets, tenant, size, sealed fields, the
pending-runs bound) so that a refused start writes nothing.

An input over the inline limit (``DURABLE_MAX_PAYLOAD_BYTES``: a long message history) is
kept beside the run (``durable.log.blobs``), written by the same script call as its
``run_started``, which holds its reference; one past ``DURABLE_MAX_RESULT_BYTES`` is refused.
A small input is written as before: in the event, with no byte or round trip more.

A part of :class:`durable.client.Client` (its base class), kept apart because a start's
checks are most of a producer's code path and none of a reader's or operator's.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import redis
from pydantic import ValidationError

from durable import catalog
from durable.agents import Registry
from durable.agents import configuration as config_
from durable.controls import sessions as sessions_
from durable.errors import (
    ConflictError,
    DecodeError,
    InvalidInput,
    RunIdConflict,
    SealError,
    TooManyPendingRuns,
    UnknownAgent,
    UsageError,
)
from durable.flow import tenants
from durable.flow.budgets import checked as checked_budgets
from durable.log import blobs, keys
from durable.log import events as ev
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec, now_ms
from durable.queue import enqueue_many, make_queue, make_ready
from durable.security.sealing import (
    contains_envelope,
    open_all,
    seal_fields,
    secret_fields,
)
from durable.settings import Settings
from durable.telemetry import tracing

if TYPE_CHECKING:
    from rq import Queue

#: Runs ``Client.start_many`` appends in one pipeline before making them ready (a
#: pipeline per chunk bounds the memory of a huge batch; smaller chunks made the batch
#: slower to run: its later chunks competed with the workers already busy on the first).
START_CHUNK = 1000


class CheckedStart(NamedTuple):
    """A run to start, its input checked (``Starts.check_start``)."""

    run_id: str
    name: str
    version: str
    tools: list[str]
    limits: dict[str, int]
    plain: Any  # the input in clear
    sensitive: tuple[str, ...]
    who: tenants.Who = tenants.Who("", "", 0)
    #: The configuration the run is pinned to (``durable.agents.configuration``), when this
    #: process has the agent; {} else (a worker pins it at its first job).
    config: dict[str, str] = {}
    #: The input is over the inline limit: kept beside the run (``durable.log.blobs``).
    beside: bool = False


@dataclass(frozen=True)
class Started:
    run_id: str
    created: bool
    state: str



class Starts:
    """The start half of the client. Its attributes are the client's (set in
    ``Client.__init__``)."""

    settings: Settings
    redis: redis.Redis
    registry: Registry
    log: EventLog
    tenant_labels: tenants.Labels
    _published: set[str]
    _queue_client: redis.Redis

    @functools.cached_property
    def queue(self) -> Queue:
        """The RQ queue runs are enqueued on, made on first use: reading runs needs no
        queue, and importing RQ is a good part of a short command's start."""
        return make_queue(self._queue_client, self.settings.worker.queue)

    def start(self, agent: str, input: Any = None, run_id: str | None = None,
              *, enqueue: bool = True, budgets: Mapping[str, float] | None = None,
              schedule: tuple[str, int] | None = None,
              parent: tuple[str, int] | None = None,
              shared_budgets: bool = False,
              continue_from: str | None = None, tenant: str | None = None,
              owner: str | None = None, priority: int | None = None,
              session: str | None = None) -> Started:
        """Start a run; the same ``run_id`` with the same agent and input returns the
        existing run, writing nothing; with another agent or input it raises
        ``RunIdConflict``.

        An agent this process imports is validated with its input model (and published to
        the catalog if no one has); any other is looked up in the catalog workers publish
        (``durable.catalog``), its input checked against the published JSON schema, and the
        run records the published version.

        ``budgets`` override the agent's limits ("steps", "model_calls", "tokens", "usd") for this
        run; they are recorded in its log. ``schedule``: the schedule and slot (s) that
        start the run, recorded in its ``run_started`` (``durable.controls.schedules``); ``parent``:
        the run and step that start it as a child (``durable.controls.children``); with
        ``shared_budgets`` the child shares the parent's budgets: ``budgets`` are then caps
        (what the parent has left), each limit the lower of the agent's and the cap, and
        the child's use is added to the parent's when it ends. ``continue_from``: a
        completed run whose conversation this one continues, by reference
        (``durable.conversations``). ``session``: a named session (of the run's tenant)
        whose latest run this one continues, by reference; refused with ``SessionBusy``
        while that run has not ended (``durable.controls.sessions``).

        ``tenant``, ``owner``, ``priority``: who the run is for, who started it and how it
        ranks among ready runs (``durable.flow.tenants``); a child inherits its parent's tenant
        and owner unless given others."""
        if run_id is None:
            run_id = uuid.uuid4().hex[:16]
        if shared_budgets and parent is None:
            raise UsageError("shared_budgets is for a child run: give its parent")
        if parent is not None and (tenant is None or owner is None):
            up = self.log.projection(parent[0])
            tenant = up.get("tenant", "") if tenant is None else tenant
            owner = up.get("owner", "") if owner is None else owner
        if session is not None:
            sessions_.checked(session)
            if continue_from:
                raise UsageError("give a session or continue_from, not both: a session "
                                 "continues its latest run")
        c = self.check_start(agent, input, run_id, budgets, tenant, owner, priority,
                             cap=shared_budgets)
        if self.log.projection(c.run_id):
            return self._existing(c.run_id, c.name, c.plain, session or "")
        if continue_from:
            self._check_continuable(continue_from)
        self._require_keys(c)
        self._admit()
        if session:
            continue_from = sessions_.claim(self.redis, self.log.projection, c.who.tenant,
                                           session, c.run_id, now_ms())
        try:
            return self._write_start(c, enqueue, schedule, parent, shared_budgets,
                                     continue_from or "", session or "")
        except Exception:
            if session and not self.log.projection(c.run_id):  # not started after all:
                sessions_.release(self.redis, c.who.tenant, session, c.run_id,
                                 continue_from or "")  # the session goes back
            raise

    def _write_start(self, c: CheckedStart, enqueue: bool, schedule: tuple[str, int] | None,
                     parent: tuple[str, int] | None, shared_budgets: bool,
                     continue_from: str, session: str) -> Started:
        """Append the checked run's ``run_started`` and make it ready."""
        handle = RunHandle(c.run_id, RunState(), actor="client")
        with tracing.start_span(c.run_id, c.name):
            created = now_ms()
            handle.staged_counts.append(self.tenant_labels.started(c.name, c.who.tenant))
            try:
                self.log.commit(handle, [self._started(c, handle, tracing.traceparent(),
                                                       schedule, parent, shared_budgets,
                                                       continue_from, session)],
                                extra={"agent": c.name, "created": str(created),
                                       **tenants.projection(c.who)})
            except ConflictError:
                return self._existing(c.run_id, c.name, c.plain, session)
            tenants.index(self.redis, self.log.keys, c.run_id, c.who.tenant, created)
            if enqueue:
                make_ready(self.redis, self.log.keys, self.queue, c.run_id, route=c.name)
        return Started(c.run_id, True, handle.state.state)

    def start_many(self, agent: str, inputs: Sequence[Any], *,
                   run_ids: Sequence[str] | None = None, enqueue: bool = True,
                   budgets: Mapping[str, float] | None = None, tenant: str | None = None,
                   owner: str | None = None, priority: int | None = None,
                   sessions: Sequence[str] | None = None) -> list[Started]:
        """Start one run of ``agent`` per input, in a few round trips whatever their number
        (one pipeline of appends, one push to the ready list), with ``start``'s guarantees
        for each: a ``run_id`` already started with the same agent and input is returned as
        it is, with another input it raises ``RunIdConflict`` before anything is written.

        Every input is validated first: one invalid input writes nothing. With
        ``DURABLE_MAX_PENDING_RUNS`` the whole batch must fit. On a cluster, or with
        ``DURABLE_MIN_REPLICAS``, the appends are made one by one. ``tenant``, ``owner``,
        ``priority``: as ``start``'s, the same for every run of the batch. ``sessions``: one
        session per input, each a different one (``start``'s ``session``); one that is busy
        refuses the whole batch, nothing written."""
        inputs = list(inputs)
        ids = list(run_ids) if run_ids is not None else [uuid.uuid4().hex[:16] for _ in inputs]
        if len(ids) != len(inputs):
            raise UsageError(f"{len(ids)} run ids for {len(inputs)} inputs")
        if len(set(ids)) != len(ids):
            raise UsageError("start_many: run ids repeat")
        names = [sessions_.checked(n) for n in sessions] if sessions is not None else None
        if names is not None and len(names) != len(inputs):
            raise UsageError(f"{len(names)} sessions for {len(inputs)} inputs")
        if names is not None and len(set(names)) != len(names):
            raise UsageError("start_many: sessions repeat (a session takes one turn at a time)")
        of = dict(zip(ids, names, strict=True)) if names is not None else {}
        checked = [self.check_start(agent, data, run_id, budgets, tenant, owner, priority)
                   for run_id, data in zip(ids, inputs, strict=True)]
        pipe = self.redis.pipeline(transaction=False)
        for run_id in ids:
            pipe.exists(self.log.keys.run(run_id))
        exists = [bool(n) for n in pipe.execute()]
        found = {c.run_id: self._existing(c.run_id, c.name, c.plain, of.get(c.run_id, ""))
                 for c, e in zip(checked, exists, strict=True) if e}
        fresh = [c for c in checked if c.run_id not in found]
        for c in fresh:
            self._require_keys(c)
        self._admit(len(fresh))
        claims = self._claim_all(fresh, of)
        trace = tracing.traceparent()
        created = now_ms()
        handles = [RunHandle(c.run_id, RunState(), actor="client") for c in fresh]
        batch = [(handle,
                  [self._started(c, handle, trace, continue_from=claims.get(c.run_id, ""),
                                 session=of.get(c.run_id, ""))],
                  {"agent": c.name, "created": str(created), **tenants.projection(c.who)})
                 for handle, c in zip(handles, fresh, strict=True)]
        for (handle, _, _), c in zip(batch, fresh, strict=True):
            handle.staged_counts.append(self.tenant_labels.started(c.name, c.who.tenant))
        # Chunk by chunk (a pipeline's memory stays bounded), each made ready once written.
        failed: Exception | None = None
        for at in range(0, len(batch), START_CHUNK):
            chunk, started = batch[at:at + START_CHUNK], []
            for (handle, _, _), c, answer in zip(chunk, fresh[at:at + START_CHUNK],
                                                 self.log.commit_many(chunk), strict=True):
                if isinstance(answer, ConflictError):  # started meanwhile by someone else
                    found[c.run_id] = self._existing(c.run_id, c.name, c.plain,
                                                     of.get(c.run_id, ""))
                elif isinstance(answer, Exception):
                    failed = failed or answer
                    if c.run_id in claims and not self.log.projection(c.run_id):
                        sessions_.release(self.redis, c.who.tenant, of[c.run_id], c.run_id,
                                          claims[c.run_id])
                else:
                    started.append(c.run_id)
                    found[c.run_id] = Started(c.run_id, True, handle.state.state)
            if started and checked[0].who.tenant:
                pipe = self.redis.pipeline(transaction=False)
                for run_id in started:
                    tenants.index(pipe, self.log.keys, run_id, checked[0].who.tenant, created)
                pipe.execute()
            if enqueue and started:
                enqueue_many(self.redis, self.log.keys, self.queue, started, route=checked[0].name)
            if failed is not None:  # what was written is ready; the caller learns the rest
                raise failed
        return [found[run_id] for run_id in ids]

    def _claim_all(self, fresh: list[CheckedStart], of: Mapping[str, str]) -> dict[str, str]:
        """Claim the session of each run that names one: {run id: the run it continues}.
        A busy session releases the claims made so far and refuses the batch."""
        claims: dict[str, str] = {}
        try:
            for c in fresh:
                if of.get(c.run_id):
                    claims[c.run_id] = sessions_.claim(self.redis, self.log.projection,
                                                       c.who.tenant, of[c.run_id], c.run_id,
                                                       now_ms())
        except Exception:
            for c in fresh:
                if c.run_id in claims:
                    sessions_.release(self.redis, c.who.tenant, of[c.run_id], c.run_id,
                                      claims[c.run_id])
            raise
        return claims

    def check_start(self, agent: str, input: Any, run_id: str,
                    budgets: Mapping[str, float] | None, tenant: str | None = None,
                    owner: str | None = None, priority: int | None = None,
                    cap: bool = False) -> CheckedStart:
        """A run to start, checked: its id, its input against the agent, its budgets and
        the input's size. Raises ``UsageError`` (and its kinds) before anything is
        written."""
        if not keys.RUN_ID_RE.match(run_id):
            raise UsageError(f"invalid run id {run_id!r}: use 1-128 of A-Z a-z 0-9 _ . : -")
        who = tenants.checked(tenant, owner, priority, required=self.settings.tenants.required)
        name, version, tools, defaults, plain, sensitive = self._checked_input(agent, input)
        given = checked_budgets(budgets or {})
        if cap:  # a shared budget: the lower of the agent's limit and what the parent has left
            given = {k: min(v, defaults.get(k, v)) for k, v in given.items()}
        limits = checked_budgets({**defaults, **given})
        beside = len(msgspec.msgpack.encode(plain)) > self.settings.payloads.max_payload_bytes
        if beside:
            blobs.check_input(plain, self.log.limits)
        local = self.registry.agents.get(name)
        config = {} if local is None else config_.pinned(
            local.configuration(self.registry), local.on_configuration_change)
        return CheckedStart(run_id, name, version, tools, limits, plain, sensitive, who,
                            config, beside)

    def _check_continuable(self, run_id: str) -> None:
        """Only a completed run that kept a conversation is continued
        (``durable.conversations``): else ``UsageError``, nothing written (a run that kept
        none was accepted here and failed at its first step)."""
        state = self.log.projection(run_id).get("state")
        if state is None:
            raise UsageError(f"continue_from: no run {run_id!r}")
        if state != "completed":
            raise UsageError(f"continue_from: run {run_id!r} is {state}, not completed: "
                             "only a completed run's conversation can be continued")
        if sessions_.kept_outcome(self.log.read(run_id, "-", "+")) is None:
            raise UsageError(f"continue_from: run {run_id!r} kept no conversation (no "
                             f"{sessions_.LOAD} or {sessions_.SAVE} step), so there is "
                             "nothing to continue: a framework agent's run keeps one when it "
                             "is a session's turn or continues another run")

    def _require_keys(self, c: CheckedStart) -> None:
        """Sensitive input fields are sealed: without keys the run is not started."""
        if c.sensitive and not self.log.keyring:
            raise UsageError(f"agent {c.name!r} has sensitive input fields "
                             f"({', '.join(c.sensitive)}): set DURABLE_ENCRYPTION_KEYS to "
                             "start it (nothing was written)")

    def _started(self, c: CheckedStart, handle: RunHandle, trace: str,
                 schedule: tuple[str, int] | None = None,
                 parent: tuple[str, int] | None = None, shared_budgets: bool = False,
                 continue_from: str = "", session: str = "") -> Spec:
        """The ``run_started`` event of a checked run, its sensitive fields sealed; an input
        over the inline limit is staged on ``handle``, to be written beside the run by the
        same script call, the event holding its reference."""
        data = seal_fields(c.plain, c.sensitive, self.log.keyring) if c.sensitive else c.plain
        large: dict[str, Any] = {}
        if c.beside:
            ref, stored = blobs.place_input(data, self.log.limits)
            handle.staged_blobs.append((ref.field, stored))
            data, large = None, {"input_blob": ref}
        name, slot = schedule or ("", 0)
        child: dict[str, Any] = {"parent": parent[0], "parent_step": parent[1]} if parent \
            else {}
        if shared_budgets:
            child["shared_budgets"] = True
        return Spec(ev.RunStarted, {"agent": c.name, "agent_version": c.version,
                                    "input": data, "tools": c.tools, "budgets": c.limits,
                                    "trace": trace, "schedule": name, "slot": slot,
                                    **child, **({"continue_from": continue_from}
                                                if continue_from else {}),
                                    **tenants.fields(c.who),
                                    **({"session": session} if session else {}),
                                    **({"config": c.config} if c.config else {}), **large})

    def _admit(self, new: int = 1) -> None:
        """Refuse ``new`` runs unless they fit under ``DURABLE_MAX_PENDING_RUNS``."""
        limit = self.settings.log.max_pending_runs
        if limit is None:
            return
        pipe = self.redis.pipeline(transaction=False)
        for shard in self.log.keys.shard_ids():  # one round trip, however many shards
            pipe.zcard(self.log.keys.runs_in_state("pending", shard))
        pending = sum(int(n) for n in pipe.execute())
        if pending + new > limit:
            raise TooManyPendingRuns(pending, limit)

    def _checked_input(self, agent: str, input: Any
                       ) -> tuple[str, str, list[str], dict[str, int], Any, tuple[str, ...]]:
        """(name, version, tools, budgets, input in clear as the run records it, its
        sensitive fields), or a ``UsageError``."""
        data = input if input is not None else {}
        try:
            spec = self.registry.agent(agent)
        except UnknownAgent:
            found = catalog.published(self.redis, agent)
            if found is None:
                known = sorted(set(self.registry.agents) | set(catalog.names(self.redis)))
                raise UnknownAgent(agent, known, "no worker has registered it") from None
            return (found.name, found.version, list(found.tools), dict(found.budgets),
                    catalog.validate(found, data), found.sensitive)
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
        dumped = model.model_dump(mode="json")
        for secret in secret_fields(type(model)):  # dumped as "**********": keep the value
            value = getattr(model, secret)
            if value is not None:
                plain = value.get_secret_value()
                dumped[secret] = plain.decode() if isinstance(plain, bytes) else plain
        return (spec.name, spec.version, list(spec.tools), checked_budgets(spec.budgets), dumped,
                spec.sensitive_input())

    def _existing(self, run_id: str, agent: str, data: Any, session: str = "") -> Started:
        """The run already started under ``run_id``, if it was started with this agent,
        input and session; else ``RunIdConflict``."""
        first = self.log.read(run_id, "-", "+", count=1)
        started = first[0].event if first else None
        if not isinstance(started, ev.RunStarted):
            raise RunIdConflict(run_id, "a log that does not begin with run_started")
        if started.agent != agent:
            raise RunIdConflict(run_id, f"agent {started.agent!r}, not {agent!r}")
        recorded = started.input
        if started.input_blob is not None:
            try:
                recorded = blobs.raw_value(self.redis, self.log.keys, run_id,
                                           started.input_blob, first[0].id)
            except DecodeError as exc:
                raise RunIdConflict(run_id, f"an input beside the run that cannot be read "
                                    f"({exc})") from None
        if self.log.keyring and contains_envelope(recorded):
            try:
                recorded = open_all(recorded, self.log.keyring)
            except SealError:
                raise RunIdConflict(run_id, "an input sealed with a key not held here") from None
        if _canonical(recorded) != _canonical(data):
            raise RunIdConflict(run_id, "a different input")
        if started.session != session:
            raise RunIdConflict(run_id, f"session {started.session!r}, not {session!r}")
        return Started(run_id, False, self.log.projection(run_id).get("state", "?"))

    def enqueue(self, run_id: str, *, force: bool = False) -> bool:
        return make_ready(self.redis, self.log.keys, self.queue, run_id, force=force)



def _canonical(data: Any) -> bytes:
    return msgspec.json.encode(data, order="sorted")
