"""Fairness and priorities when workers take ready runs.

A route's ready runs (``keys.ready``: one route per agent) are kept in two places on the
queue's server:

- the **plain list** (``dx:ready:<queue>:<route>``): runs with no tenant and priority 0,
  first in, first out, as before;
- the **fair side** (``keys.fair``): runs with a tenant or a priority, ordered by
  start-time fair queueing. Each tenant's next run starts one round after its previous
  one, and no earlier than the route's current round (the start of the last run taken):
  runs are taken round-robin by tenant, so one tenant's backlog of 10,000 delays another
  tenant's first run by about one run per tenant with ready runs, not by 10,000.

**Priority and aging.** A run of priority ``p > 0`` (up to 100, ``start(..., priority=)``)
is placed ``p x AGING`` rounds ahead of the current round, ahead of its own tenant's ready
runs too; a run of ``p < 0`` is placed ``-p x AGING`` rounds behind where fairness puts
it. Each run taken advances the round to its own start, so a waiting run ages: whatever
arrives later, a run is passed by at most ``(p - q) x AGING`` runs of a higher priority
``p`` than its own ``q`` (and those tied with it: ties go by run id), then it is taken. A
run prioritized ahead of the current round is taken before the plain list. (A producer
that gives every run a priority jumps its tenant ahead: priority is a producer's promise,
fairness the default.)

The two sides are taken in turn (``ready_take.lua``): the plain list counts as one more
tenant. Workers take ready runs with that script (``EVALSHA``, ``take_command``) instead
of ``LPOP``, in the same round trips as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import redis

from durable.log import keys
from durable.log.scripts import source

#: Rounds one priority level moves a run ahead (see the module's doc).
AGING = 10


@cache
def _script(name: str) -> str:
    """A script's source without its comment lines."""
    return "\n".join(line for line in source(name).splitlines()
                     if line.strip() and not line.lstrip().startswith("--"))


@cache
def _sha(name: str) -> str:
    return hashlib.sha1(_script(name).encode()).hexdigest()


def _keys(ready_key: str) -> list[str]:
    return [keys.fair(ready_key, part) for part in ("runs", "clock", "prio")]


def is_plain(tenant: str, priority: int) -> bool:
    """Whether a run goes on the plain list (no tenant, priority 0)."""
    return not tenant and not priority


def push(conn: Any, ready_key: str, entries: Sequence[tuple[str, str, int]],
         pipe: Any = None) -> None:
    """Make ``(run id, tenant, priority)`` s ready on the fair side of ``ready_key``, on
    ``conn`` or in its pipeline ``pipe`` (``EVALSHA``: producers are refused ``EVAL``)."""
    if entries:
        script = conn.register_script(_script("ready_push"))
        script(keys=_keys(ready_key), args=[AGING, *[x for e in entries for x in e]],
               client=pipe if pipe is not None else conn)


def take_command(ready_key: str, count: int | None = None) -> tuple[Any, ...]:
    """The command that takes up to ``count`` ready runs of ``ready_key``'s route (as
    ``LPOP key count``; without ``count``, one run id or nil, as ``LPOP key``): an
    ``EVALSHA`` of ``ready_take.lua`` (``load`` it first)."""
    return ("EVALSHA", _sha("ready_take"), 4, ready_key, *_keys(ready_key),
            "" if count is None else count, AGING)


def load(conn: Any) -> None:
    """Load ``ready_take.lua`` on the queue's server (a worker at start, and after the
    server forgot it: a restart)."""
    conn.script_load(_script("ready_take"))


def take(send: Callable[..., Any], conn: Any, ready_key: str, count: int | None) -> Any:
    """``send(*take_command(...))``'s reply; the script is loaded again once when the
    server answers that it does not know it."""
    try:
        return send(*take_command(ready_key, count))
    except redis.exceptions.NoScriptError:
        load(conn)
        return send(*take_command(ready_key, count))


def asked(command: Sequence[Any]) -> int:
    """How many runs a ``take_command`` asked for."""
    return int(command[-2] or 1)


def depth(conn: Any, ready_key: str) -> list[Any]:
    """Commands (on a pipeline) whose replies add up to the route's ready runs."""
    return [conn.llen(ready_key), conn.zcard(keys.fair(ready_key, "runs"))]


def is_ready(conn: Any, ready_key: str, run_id: str) -> bool:
    """Whether ``run_id`` waits on the route's plain list or fair side."""
    return conn.lpos(ready_key, run_id) is not None or \
        conn.zscore(keys.fair(ready_key, "runs"), run_id) is not None
