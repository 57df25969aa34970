"""Resolving an *unknown* outcome with the tool's ``lookup``: shared by workers and the
reconciler, so both decide the same way.

``lookup`` is asked only once the earlier dispatch's deadline (plus a clock-skew margin)
has passed: before that, a slow first attempt could still land, so "not applied" would
prove nothing.
"""

from __future__ import annotations

import logging

import redis

from durable.agents import Tool, resolve_awaitable
from durable.log import counters, keys
from durable.log import events as ev
from durable.log.state import Action
from durable.log.store import Spec, now_ms

log = logging.getLogger("durable.outcomes")

#: When a lookup fails (the authoritative system did not answer), ask again after this (ms).
LOOKUP_RETRY_MS = 2000

#: How long an operator has to settle an outcome nobody can tell (ms).
OPERATOR_WAIT_MS = 7 * 86400 * 1000

#: In the reason of a run waiting for an operator to settle an unknown outcome (what
#: ``durable runs --stuck`` and ``durable_runs_unsettled`` look for in the projection).
NO_LOOKUP = "lookup cannot tell"


def resolve_unknown(client: redis.Redis, tool: Tool, act: Action, run_id: str) -> list[Spec]:
    """The events that settle ``act`` according to the authoritative system; none when the
    lookup itself failed (the caller tries again later)."""
    base = {"step": act.step, "key": act.key}
    try:
        ask = tool.lookup_compensation if act.undoes else tool.lookup  # an undo: its own
        found = resolve_awaitable(ask(act.key, dict(act.args or {})))
    except Exception as exc:
        # The authoritative system did not answer: ask again later (an explicit
        # ``Lookup.unknown()`` is what sends the run to an operator).
        log.warning("lookup of %s failed: %r; will ask again", act.key, exc)
        client.hincrby(keys.STATS, "lookup_errors", 1)
        counters.incr(client, counters.LOOKUPS, "error")
        return []
    if found.status == "applied":
        client.hincrby(keys.STATS, "duplicates_suppressed", 1)
        return [Spec(ev.ActionReconciled, {**base, "resolution": "applied",
                                           "result": found.result})]
    if found.status == "not_applied" and tool.lookup_authoritative:
        client.hincrby(keys.STATS, "redispatched_after_lookup", 1)
        return [Spec(ev.ActionReconciled, {**base, "resolution": "not_applied"})]
    reason = f"outcome of {act.key} ({act.tool}) unknown: {NO_LOOKUP}; " \
             f"an operator settles step {act.step} (durable settle)"
    return [
        Spec(ev.ActionReconciled, {**base, "resolution": "unknown"}),
        Spec(ev.WaitEntered, {"kind": "external", "reason": reason,
                              "until": now_ms() + OPERATOR_WAIT_MS, "request": act.key}),
    ]
