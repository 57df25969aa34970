"""Durable schedules: a cron expression that starts one run of an agent per slot.

A schedule is a definition in ``dx:{schedules}:defs`` (name -> JSON ``Schedule``) and its
next slot not yet handled in the schedules' due-set ``dx:{schedules}:next`` (name -> ms),
which the reconciler sweeps (``Schedules.sweep``). Both keys share one hash tag, so
``schedule_write.lua`` changes a definition and its next slot together, on a cluster too.

**One run per slot.** A slot's run id derives from the schedule and the slot: ``NAME-<slot
in s since the epoch>`` (``slot_run_id``), and it is started with ``Client.start``, which
is a no-op for a run id that exists. Several reconcilers sweeping at once compute the same
slots, start the same run ids (one wins, the others find the run) and advance the next slot
only if it is still where they read it (``schedule_advance.lua``); the runs are started
before it is advanced, so a reconciler dying in between leaves the slots due, not lost.

**Expressions** are croniter's, evaluated in UTC: five fields (minute resolution) or six,
the sixth being seconds (``"* * * * * */10"``: every ten seconds), or an alias
(``@hourly``, ``@daily``...).

**Missed slots.** A slot is *missed* when the sweep that finds it is more than the
schedule's ``grace_s`` late (every process was down, or the schedule had a backlog); slots
within the grace are on time and each starts its run. Of the missed slots, policy
``latest`` (the default: catch up one) starts only the most recent one; ``skip`` starts
none. Either way, the sweep then goes on from the first slot on time. A paused schedule
has no slots: ``resume`` starts again at the first slot after it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import redis

from durable.controls import sessions
from durable.controls.starts import Starts
from durable.errors import DurableError, ScheduleNotFound, UsageError
from durable.log import keys
from durable.log.scripts import Scripts
from durable.log.store import now_ms

log = logging.getLogger("durable.schedules")

#: Schedule names: a run id is NAME-<10 digits>, within ``keys.RUN_ID_RE``.
NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")

#: What happens to missed slots (see the module's docstring).
POLICIES = ("latest", "skip")

#: The most slots one sweep starts for one schedule; the rest stay due for the next sweep.
SLOTS_PER_SWEEP = 100

#: Missed slots counted one by one at most (``Plan.skipped``), beyond which it is a floor.
COUNT_LIMIT = 10_000

#: An unreadable definition is reported again after this long (ms), not at every sweep.
UNREADABLE_RETRY_MS = 60_000


class Schedule(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A schedule's definition as stored. New fields get defaults (as events do)."""

    name: str
    cron: str
    agent: str
    input: Any = None
    #: Missed slots: "latest" (catch up one) or "skip".
    missed: str = "latest"
    #: How late (s) a slot may be found and still be on time.
    grace_s: int = 60
    paused: bool = False
    created: int = 0
    by: str = ""
    #: The tenant and owner of every run the schedule starts (``durable.flow.tenants``).
    tenant: str = ""
    owner: str = ""
    #: The named session each run is the next turn of (``durable.controls.sessions``), or "".
    session: str = ""


@dataclass(frozen=True)
class Listed:
    """A schedule as ``list`` shows it: ``schedule`` None when its definition is
    unreadable (``error`` says why); ``next_ms`` None while paused."""

    name: str
    schedule: Schedule | None
    next_ms: int | None
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.schedule is not None:
            out.update(msgspec.structs.asdict(self.schedule))
        return {**out, "next": self.next_ms, "error": self.error}


@dataclass(frozen=True)
class Plan:
    """What a sweep does for one due schedule: the slots (s) to start, oldest first, the
    next slot not handled (ms), and how many missed slots are not started."""

    slots: list[int]
    next_ms: int
    skipped: int = 0


class Unreadable(DurableError):
    """A stored definition that cannot be decoded or whose expression is not valid."""


def slot_run_id(name: str, slot: int) -> str:
    """The run id of a schedule's slot (s since the epoch)."""
    return f"{name}-{slot}"


def check_cron(expr: str) -> str:
    """``expr`` if croniter accepts it and it has a next slot, else ``UsageError``."""
    fields = expr.split()
    if not expr.startswith("@") and len(fields) not in (5, 6):
        raise UsageError(f"cron expression {expr!r}: use 5 fields (minute hour day month "
                         "weekday) or 6 (the sixth is seconds)")
    from croniter import CroniterError

    try:
        _after(expr, int(now_ms() // 1000))
    except (CroniterError, ValueError, KeyError) as exc:
        raise UsageError(f"cron expression {expr!r}: {exc}") from None
    return " ".join(fields)


def _cron(expr: str, t: int) -> Any:
    """croniter's iterator over the slots of ``expr`` around ``t`` (s), imported when a
    schedule is first planned: a client that never plans one does not load it."""
    from croniter import croniter

    return croniter(expr, datetime.fromtimestamp(t, UTC))


def _after(expr: str, t: int) -> int:
    """The first slot strictly after ``t`` (s)."""
    return int(_cron(expr, t).get_next(float))


def _before(expr: str, t: int) -> int:
    """The last slot strictly before ``t`` (s)."""
    return int(_cron(expr, t).get_prev(float))


def plan(s: Schedule, next_ms: int, now: int, limit: int = SLOTS_PER_SWEEP) -> Plan:
    """The slots to start at ``now`` (ms) for a schedule whose next slot not yet handled
    is ``next_ms``: a pure function of its arguments (``now`` is passed in)."""
    horizon = now - s.grace_s * 1000  # slots before it are missed
    first = -(-next_ms // 1000)
    slots: list[int] = []
    skipped = 0
    if next_ms < horizon:
        edge = -(-horizon // 1000)  # slots < edge (s) are missed
        latest = max(_before(s.cron, edge), first)
        it = _cron(s.cron, first - 1)
        slot = int(it.get_next(float))
        while slot < edge and skipped < COUNT_LIMIT:
            skipped += 1
            slot = int(it.get_next(float))
        if s.missed == "latest":
            slots.append(latest)
            skipped -= 1
        first = edge
    it = _cron(s.cron, first - 1)
    slot = int(it.get_next(float))
    while slot * 1000 <= now and len(slots) < limit:
        slots.append(slot)
        slot = int(it.get_next(float))
    return Plan(slots, slot * 1000, max(skipped, 0))


def decode(raw: bytes) -> Schedule:
    try:
        s = msgspec.json.decode(raw, type=Schedule)
        check_cron(s.cron)
    except (msgspec.DecodeError, UsageError) as exc:
        raise Unreadable(str(exc)) from None
    if s.missed not in POLICIES or s.grace_s < 0:
        raise Unreadable(f"missed {s.missed!r}, grace_s {s.grace_s}")
    return s


class Schedules:
    """The schedules of one client's Redis (``client.schedules``). It starts runs through
    the client's start half (``durable.controls.starts``), the only part of the client it uses."""

    def __init__(self, client: Starts) -> None:
        self.client = client
        self.redis: redis.Redis = client.redis
        self.scripts = Scripts(client.redis)

    def _write(self, mode: str, name: str, s: Schedule | None, next_ms: int | None) -> bool:
        return bool(self.scripts.schedule_write(
            keys=[keys.SCHEDULES, keys.SCHEDULES_NEXT, keys.SCHEDULE_ERRORS],
            args=[mode, name, msgspec.json.encode(s) if s else "",
                  "" if next_ms is None else next_ms]))

    # Operators ---------------------------------------------------------------------------

    def add(self, name: str, cron: str, agent: str, input: Any = None, *,
            missed: str = "latest", grace_s: int = 60, by: str = "operator",
            now: int | None = None, tenant: str | None = None,
            owner: str | None = None, session: str | None = None) -> Listed:
        """Add a schedule; its first slot is the first after ``now``. The name, the
        expression, the agent and the input are checked as a start checks them: a
        ``UsageError`` writes nothing. A name in use is refused (delete it first).
        ``session``: each run is the next turn of that session (of ``tenant``); a slot
        whose session's latest run has not ended is refused (``SessionBusy``), recorded
        as the schedule's error like any refused slot."""
        if not NAME_RE.match(name):
            raise UsageError(f"invalid schedule name {name!r}: use 1-100 of A-Z a-z 0-9 _ . : -")
        if missed not in POLICIES:
            raise UsageError(f"missed must be one of {', '.join(POLICIES)}, not {missed!r}")
        if grace_s < 0:
            raise UsageError(f"grace must be >= 0 s, not {grace_s}")
        cron = check_cron(cron)
        if session is not None:
            sessions.checked(session)
        now = now if now is not None else now_ms()
        checked = self.client.check_start(agent, input, slot_run_id(name, now // 1000), None,
                                          tenant, owner)
        if checked.sensitive:  # the definition would hold them in clear
            raise UsageError(f"agent {checked.name!r} has sensitive input fields "
                             f"({', '.join(checked.sensitive)}): it cannot be scheduled "
                             "(nothing was written)")
        s = Schedule(name=name, cron=cron, agent=checked.name, input=checked.plain,
                     missed=missed, grace_s=grace_s, created=now, by=by,
                     tenant=checked.who.tenant, owner=checked.who.owner,
                     session=session or "")
        first = _after(cron, now // 1000) * 1000
        if not self._write("add", name, s, first):
            raise UsageError(f"schedule {name!r} exists already; delete it first")
        return Listed(name, s, first)

    def get(self, name: str) -> Listed:
        raw = self.redis.hget(keys.SCHEDULES, name)
        if raw is None:
            raise ScheduleNotFound(name)
        return self._listed(name, raw, self.redis.zscore(keys.SCHEDULES_NEXT, name),
                            self.redis.hget(keys.SCHEDULE_ERRORS, name))

    def list(self) -> list[Listed]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.SCHEDULES)
        pipe.zrange(keys.SCHEDULES_NEXT, 0, -1, withscores=True)
        pipe.hgetall(keys.SCHEDULE_ERRORS)
        defs, nexts, errors = pipe.execute()
        due = {k.decode(): v for k, v in nexts}
        return sorted((self._listed(k.decode(), v, due.get(k.decode()), errors.get(k))
                       for k, v in defs.items()), key=lambda entry: entry.name)

    @staticmethod
    def _listed(name: str, raw: bytes, score: float | None, error: bytes | None) -> Listed:
        try:
            s: Schedule | None = decode(raw)
        except Unreadable as exc:
            return Listed(name, None, None, f"unreadable definition: {exc}")
        why = msgspec.json.decode(error).get("error", "") if error else ""
        return Listed(name, s, None if score is None else int(score), why)

    def pause(self, name: str) -> Listed:
        """Stop starting runs (a run already started goes on); paused slots never run."""
        entry = self._readable(name)
        if entry.schedule is None or entry.schedule.paused:
            return entry
        s = msgspec.structs.replace(entry.schedule, paused=True)
        if not self._write("put", name, s, None):
            raise ScheduleNotFound(name)
        return Listed(name, s, None, entry.error)

    def resume(self, name: str, now: int | None = None) -> Listed:
        """Start runs again from the first slot after ``now``."""
        entry = self._readable(name)
        if entry.schedule is None or not entry.schedule.paused:
            return entry
        s = msgspec.structs.replace(entry.schedule, paused=False)
        first = _after(s.cron, (now if now is not None else now_ms()) // 1000) * 1000
        if not self._write("put", name, s, first):
            raise ScheduleNotFound(name)
        return Listed(name, s, first, entry.error)

    def delete(self, name: str) -> None:
        """Delete the schedule; the runs it started are left as they are."""
        if not self._write("delete", name, None, None):
            raise ScheduleNotFound(name)

    def _readable(self, name: str) -> Listed:
        entry = self.get(name)
        if entry.schedule is None:
            raise UsageError(f"schedule {name!r}: {entry.error}; delete it and add it again")
        return entry

    # The reconciler ----------------------------------------------------------------------

    def sweep(self, now: int | None = None, limit: int = 100) -> dict[str, str]:
        """Start the runs of the slots due at ``now`` (ms) of up to ``limit`` schedules;
        returns name -> what was done. One bad schedule never stops the others."""
        now = now if now is not None else now_ms()
        due = self.redis.zrangebyscore(keys.SCHEDULES_NEXT, "-inf", now, 0, limit,
                                       withscores=True)
        if not due:
            return {}
        raws = self.redis.hmget(keys.SCHEDULES, [name for name, _ in due])
        done: dict[str, str] = {}
        for (raw_name, score), raw in zip(due, raws, strict=True):
            name = raw_name.decode()
            try:
                done[name] = self._fire(name, int(score), raw, now)
            except redis.RedisError:
                raise  # Redis itself: the reconciler waits for it; the slots stay due
            except Exception as exc:
                log.exception("schedule %s", name)
                done[name] = f"error: {exc!r}"
        return done

    def _fire(self, name: str, next_ms: int, raw: bytes | None, now: int) -> str:
        if raw is None:  # deleted meanwhile
            self._advance(name, next_ms, None)
            return "gone"
        try:
            s = decode(raw)
        except Unreadable as exc:
            log.error("schedule %s: unreadable definition, skipped: %s", name, exc)
            self.redis.hincrby(keys.STATS, "schedules_unreadable", 1)
            self._advance(name, next_ms, now + UNREADABLE_RETRY_MS)
            return f"unreadable: {exc}"
        p = plan(s, next_ms, now)
        started, refused = [], []
        for slot in p.slots:
            run_id = slot_run_id(name, slot)
            try:
                if self.client.start(s.agent, s.input, run_id, schedule=(name, slot),
                                     tenant=s.tenant or None,
                                     owner=s.owner or None,
                                     session=s.session or None).created:
                    started.append(run_id)
            except UsageError as exc:  # the agent or its input changed since the add
                log.error("schedule %s: slot %d not started: %s", name, slot, exc)
                refused.append(run_id)
                self.redis.hset(keys.SCHEDULE_ERRORS, name, msgspec.json.encode(
                    {"at": now, "slot": slot, "error": str(exc)}))
        if not refused and p.slots:
            self.redis.hdel(keys.SCHEDULE_ERRORS, name)
        self._count("schedule_runs_started", len(started))
        self._count("schedule_slots_refused", len(refused))
        self._count("schedule_slots_missed", p.skipped)
        self._advance(name, next_ms, p.next_ms)
        parts = [f"started {', '.join(started)}" if started else "",
                 f"refused {', '.join(refused)}" if refused else "",
                 f"skipped {p.skipped} missed" if p.skipped else ""]
        return "; ".join(part for part in parts if part) or "nothing new"

    def _count(self, stat: str, n: int) -> None:
        if n:
            self.redis.hincrby(keys.STATS, stat, n)

    def _advance(self, name: str, expected: int, next_ms: int | None) -> bool:
        return bool(self.scripts.schedule_advance(
            keys=[keys.SCHEDULES_NEXT],
            args=[name, expected, "" if next_ms is None else next_ms]))
