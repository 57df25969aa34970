"""The global indexes are derived data: rebuild them from the run projections and logs, and
read them across the layout's shards (``durable.log.keys``)."""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from durable.errors import RunNotFound
from durable.log.keys import KeyLayout
from durable.log.state import ALL_STATES


class SessionTurn(NamedTuple):
    """A run that is a turn of a named session, as its log says (``durable.controls.sessions``)."""

    tenant: str
    session: str
    run_id: str
    continue_from: str
    created: int


@dataclass
class Repaired:
    """What ``repair`` did: runs indexed again, runs whose log could not be read (with why:
    they are left out of the indexes, never dropped silently), and the session turns found
    (``durable.controls.sessions.rebuild`` restores the session keys from them)."""

    runs: int = 0
    unreadable: dict[str, str] = field(default_factory=dict)
    turns: list[SessionTurn] = field(default_factory=list)


def repair(client: Any) -> Repaired:
    """Rebuild ``dx:runs``, ``dx:runs:<state>``, the tenants' indexes and the due-set from
    every run's log, shard by shard; each run's projection gets its state, version and step
    from its fold."""
    r, layout = client.redis, client.log.keys
    report = Repaired()
    for shard in layout.shard_ids():
        # One call (a cluster pipeline deletes one key at a time): the shard's keys share
        # a slot.
        r.delete(layout.runs_index(shard), layout.due(shard),
                 *[layout.runs_in_state(s, shard) for s in ALL_STATES])
        pipe = r.pipeline(transaction=False)
        for raw in r.scan_iter(match=layout.log_pattern(shard), count=500):
            run_id = layout.run_of_log(raw.decode())
            try:
                handle = client.log.load(run_id)
            except Exception as exc:  # an undecodable or future-version entry, a bad key
                report.unreadable[run_id] = f"{type(exc).__name__}: {exc}"
                continue
            state = handle.state
            pipe.zadd(layout.runs_index(shard), {run_id: state.updated})
            if state.tenant:
                pipe.zadd(layout.runs_of_tenant(state.tenant, shard), {run_id: state.created})
            pipe.zadd(layout.runs_in_state(state.state, shard), {run_id: state.updated})
            pipe.hset(layout.run(run_id), mapping={"state": state.state,
                                                   "version": state.version,
                                                   "step": state.step})
            due = client.log.due_for(state, state.updated)
            if due != "-":
                pipe.zadd(layout.due(shard), {run_id: int(due)})
            if state.session:
                report.turns.append(SessionTurn(state.tenant or "", state.session, run_id,
                                                state.continue_from, state.created))
            report.runs += 1
        pipe.execute()
    return report


def newest(r: Any, layout: KeyLayout, state: str | None, after: str | None = None,
           batch: int = 100) -> Iterator[str]:
    """Run ids by update time, newest first (ties: the greater id first, as ``ZREVRANGE``),
    across every shard of the index of ``state`` (all runs when None); ``after``: start
    below that run. Raises ``RunNotFound`` for an ``after`` not in the index."""
    for run_id, _score in ordered(r, layout, state, after, batch=batch):
        yield run_id


def ordered(r: Any, layout: KeyLayout, state: str | None, after: str | None = None, *,
            oldest_first: bool = False, batch: int = 100,
            tenant: str | None = None) -> Iterator[tuple[str, float]]:
    """(run id, update time) across every shard of the index of ``state`` (all runs when
    None; with ``tenant``: that tenant's index, by start time, whatever ``state``),
    newest first (ties: the greater id first, as ``ZREVRANGE``) or ``oldest_first``
    (ties: the smaller id first, as ``ZRANGE``); ``after``: start past that run. Raises
    ``RunNotFound`` for an ``after`` not in the index."""
    shards = layout.shard_ids()

    def index(shard: int | None) -> str:
        if tenant:
            return layout.runs_of_tenant(tenant, shard)
        return layout.runs_in_state(state, shard) if state else layout.runs_index(shard)

    starts = {s: 0 for s in shards}
    if after is not None:
        home = shards[0] if len(shards) == 1 else layout.shard_of(after)
        score = r.zscore(index(home), after)
        if score is None:
            raise RunNotFound(after)
        for s in shards:
            if oldest_first:
                before = r.zcount(index(s), "-inf", f"({score}")
                ties = r.zrangebyscore(index(s), score, score)
                starts[s] = before + sum(1 for t in ties if t.decode() <= after)
            else:
                above = r.zcount(index(s), f"({score}", "+inf")
                ties = r.zrangebyscore(index(s), score, score)
                starts[s] = above + sum(1 for t in ties if t.decode() >= after)
    walks = [_walk_scored(r, index(s), starts[s], batch, oldest_first) for s in shards]
    for _key, _tie, run_id, score in heapq.merge(*walks):
        yield run_id, score


class _Desc(str):
    """A string that sorts in reverse (a merge key for 'greater id first')."""

    def __lt__(self, other: object) -> bool:
        return str.__gt__(self, other)  # type: ignore[operator]


def _walk_scored(r: Any, index: str, start: int, batch: int,
                 oldest_first: bool) -> Iterator[tuple[float, str, str, float]]:
    read = r.zrange if oldest_first else r.zrevrange
    while True:
        page = read(index, start, start + batch - 1, withscores=True)
        if not page:
            return
        start += len(page)
        for member, score in page:
            run_id = member.decode()
            if oldest_first:
                yield score, run_id, run_id, score
            else:
                yield -score, _Desc(run_id), run_id, score


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    state: str
    agent: str
    step: int
    version: int
    updated: int
    reason: str = ""
    tenant: str = ""
    owner: str = ""
    #: What its model calls cost so far (US dollars, exact decimal text), and how many have
    #: no known cost (``durable.costs``).
    cost_usd: str = "0"
    uncosted: int = 0


def run_summary(run_id: str, p: Mapping[str, str]) -> RunSummary:
    """A row of ``runs`` from the run's projection."""
    usd, _, uncosted = p.get("cost", "0 0").partition(" ")
    return RunSummary(run_id, p.get("state", "?"), p.get("agent", ""), int(p.get("step", 0)),
                      int(p.get("version", 0)), int(p.get("updated", 0)), p.get("reason", ""),
                      p.get("tenant", ""), p.get("owner", ""), usd or "0",
                      int(uncosted or 0))
