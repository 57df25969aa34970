"""Orphaned runs: runs that are not over and that nothing will move on.

A run is *orphaned* when it is not terminal and none of what gives a run its next event is
there for it:

- a **lease** held now (a worker, or a reconciler, is driving it);
- its id on a **ready list** (``durable.queue``: a worker's ``drain`` takes it);
- an entry in the **due-set** that a sweeping reconciler will reach: due in the future, or
  due for less than the grace (``grace_ms``; a live reconciler claims every due run within
  a sweep, so an entry overdue for longer says that no reconciler is sweeping). Retry and
  timer waits, wait deadlines, leases to check, unknown outcomes past their deadline and
  schedules all wake a run through this entry;
- a **party that will answer**: an open approval request, an input or external wait
  whose deadline has not passed, a child run that has not ended (its end wakes its parent);
- an **operator's hand**: a quarantined run waits for one by design (``durable runs
  --state quarantined``; a pending cancel of it is a reconciler's, through the due-set).

Everything above is derived data or a process's presence; the log stays the truth, so an
orphan is found from what is *missing* around a log. A running reconciler gives it a next
event again once it is due: ``durable reconcile RUN``, the console's *reconcile* button
(``Client.reconcile_soon``), or ``durable repair-index``, which rebuilds the due-set.

Cheap checks first: one pipeline reads the lease, the due entry and the projection of every
run in a non-terminal state; only the few left over are looked for on the ready lists, and
only the waiting ones among those are folded. :func:`find` is what ``Client.orphaned``,
``durable runs --orphaned``, the console's runs page and the ``durable_runs_orphaned`` gauge
call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durable.errors import DurableError
from durable.log import keys
from durable.log.state import ACTIVE, TERMINAL, WAITING, RunState
from durable.log.store import EventLog, now_ms
from durable.settings import Settings

if TYPE_CHECKING:
    from rq import Queue

#: Least time (ms) a due entry may be overdue before no reconciler is taken to be sweeping.
ORPHAN_GRACE_MS = 60_000

#: Runs read per round trip.
PAGE = 500

#: Waits that something other than the reconciler ends: an answer, a decision, a child.
ANSWERED = frozenset({"input", "external", "approval", "child"})


@dataclass(frozen=True)
class Orphan:
    """A run with no valid next event, and why: what is missing around it."""

    run_id: str
    state: str
    agent: str
    #: When its projection last changed (ms since the epoch).
    updated: int
    why: str


def grace_ms(settings: Settings) -> int:
    """How long a due entry may be overdue while a reconciler sweeps: the larger of
    ``ORPHAN_GRACE_MS``, 20 sweeps (``DURABLE_RECONCILE_INTERVAL_S``) and 4 lease lifetimes."""
    return max(ORPHAN_GRACE_MS, int(settings.reconciler.interval_s * 20_000),
               4 * settings.leases.ttl_ms)


def find(elog: EventLog, queue: Queue, *, now: int | None = None,
         grace: int = ORPHAN_GRACE_MS, limit: int | None = None) -> list[Orphan]:
    """The orphaned runs (see the module's doc), the longest-untouched first within each
    state. ``now``: the time to judge at (ms; a test passes a later one instead of
    sleeping); ``limit``: the most runs of each state and shard examined (None: all),
    the least recently updated first, where orphans gather."""
    now = now if now is not None else now_ms()
    r, layout = elog.redis, elog.keys
    found: list[Orphan] = []
    for state in sorted(ACTIVE | WAITING):
        for shard in layout.shard_ids():
            index, start = layout.runs_in_state(state, shard), 0
            while limit is None or start < limit:
                size = PAGE if limit is None else min(PAGE, limit - start)
                page = [_s(m) for m in r.zrange(index, start, start + size - 1)]
                found += _judge(elog, queue, page, now, grace)
                if len(page) < size:
                    break
                start += size
    return found


def _judge(elog: EventLog, queue: Queue, run_ids: list[str], now: int,
           grace: int) -> list[Orphan]:
    r, layout = elog.redis, elog.keys
    pipe = r.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.exists(layout.lease(run_id))
        pipe.zscore(layout.due_of(run_id), run_id)
        pipe.hmget(layout.run(run_id), ["state", "agent", "updated", "cancel"])
    replies = pipe.execute()
    left: list[tuple[str, str, str, int, str]] = []
    for i, run_id in enumerate(run_ids):
        held, due, (state, agent, updated, cancel) = replies[3 * i:3 * i + 3]
        if held or state is None:
            continue  # driven now, or the index names a run that is gone
        state_s = _s(state)
        if state_s in TERMINAL or (state_s == "quarantined" and _s(cancel or b"") != "1"):
            continue  # over, or parked for an operator by design
        if due is not None and float(due) >= now - grace:
            continue  # a sweeping reconciler reaches it
        why = "not in the due-set" if due is None else \
            f"due since {_ago(now - int(float(due)))} and no reconciler took it"
        left.append((run_id, state_s, _s(agent or b""), int(updated or 0), why))
    if not left:
        return []
    ready = _on_ready_lists(queue, [(run_id, agent) for run_id, _, agent, _, _ in left])
    out = []
    for run_id, state_s, agent, updated, why in left:
        if run_id in ready:
            continue
        answer, unread = _answered_by(elog, run_id, now) if state_s in WAITING else (None, "")
        if answer is None:
            out.append(Orphan(run_id, state_s, agent, updated,
                              f"no lease, on no ready list, {why}{unread}"))
    return out


def _on_ready_lists(queue: Queue, runs: list[tuple[str, str]]) -> set[str]:
    """The runs found on a ready list of their agent (any of its versions' routes too)."""
    conn = queue.connection
    routes = [_s(x) for x in conn.smembers(keys.routes(queue.name))]
    pipe = conn.pipeline(transaction=False)
    asked: list[str] = []
    for run_id, agent in runs:
        for route in ["", *[x for x in routes if x == agent or x.startswith(f"{agent}@")]]:
            ready = keys.ready(queue.name, route)
            pipe.lpos(ready, run_id)
            pipe.zscore(keys.fair(ready, "runs"), run_id)
            asked.append(run_id)
    replies = pipe.execute()
    return {run_id for i, run_id in enumerate(asked)
            if replies[2 * i] is not None or replies[2 * i + 1] is not None}


def _answered_by(elog: EventLog, run_id: str, now: int) -> tuple[str | None, str]:
    """What will wake a waiting run without the reconciler (None: nothing): an open
    approval, an unexpired input or external wait, a child that has not ended; and a note
    when its log could not be read (whoever reads it next quarantines it)."""
    try:
        state = elog.load(run_id, actor="orphans").state
    except DurableError as exc:
        return None, f"; its log is unreadable ({exc})"
    wait = state.wait
    if wait is None or wait.kind not in ANSWERED or (wait.deadline and wait.deadline <= now):
        return None, ""
    if wait.kind == "approval":
        open_ = [a for a in state.approvals.values()
                 if a.decision is None and (not a.expires or a.expires > now)]
        return (f"approval {open_[0].request}" if open_ else None), ""
    if wait.kind == "child":
        return _live_child(elog, state), ""
    return f"{wait.kind} {wait.request}", ""


def _live_child(elog: EventLog, parent: RunState) -> str | None:
    wait = parent.wait
    child = str(wait.data.get("child", "")) if wait and isinstance(wait.data, dict) else ""
    if not child:
        return None
    state = elog.redis.hget(elog.keys.run(child), "state")
    return f"child {child}" if state is not None and _s(state) not in TERMINAL else None


def _ago(ms: int) -> str:
    s = max(ms, 0) // 1000
    return f"{s} s ago" if s < 120 else f"{s // 60} min ago"


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
