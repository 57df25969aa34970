"""The shared counters: what each event adds to the Prometheus counters and histograms.

Counters live in Redis hashes (``KeyLayout.metrics``, one per shard), not in a process's memory,
so that any number of workers, reconcilers and producers add to the same totals and a
restart loses nothing. Most of them count events, and those are incremented by
``append.lua`` in the same script call that appends the events: a counter moves if and only
if its event is in a log, so it equals what a count over the logs finds. The few that count
something the log does not record (a lookup that raised, a reconciler's decision) are
incremented where that happens, with :func:`incr`.

A field is the JSON array ``[metric, label values..., bucket]``; every value is an integer
(durations in milliseconds). ``durable.telemetry.metrics`` turns the hash into Prometheus families.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import redis

from durable.log import events as ev
from durable.log import keys
from durable.log.state import RunState

#: Histogram buckets (seconds): steps are model and API calls of 0.5-30 s, or no-ops.
STEP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                  120.0, 300.0)
#: Cancellation latency (request -> ``canceled``), seconds.
CANCEL_BUCKETS_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: Outcome label of each event that records what a dispatched step came to.
OUTCOMES: dict[type[ev.Event], str] = {
    ev.ActionSucceeded: "succeeded",
    ev.ActionFailed: "failed",
    ev.ActionTimedOut: "timed_out",
    ev.ActionInterrupted: "interrupted",
    ev.CallCanceled: "canceled",
    ev.ActionReconciled: "reconciled",
}

# Metric names inside the hash (the Prometheus names are in ``durable.telemetry.metrics``).
STEPS = "steps"
STEP_DURATION = "step_duration"
CANCEL_LATENCY_METRIC = "cancel_latency"
DUPLICATES = "duplicates_suppressed"
LOOKUPS = "lookups"
LEASE_EXPIRIES = "lease_expiries"
RECONCILER_ACTIONS = "reconciler_actions"


@functools.lru_cache(maxsize=4096)
def field(metric: str, *labels: str) -> str:
    """A field's name (cached: the same few series are counted on every step)."""
    return json.dumps([metric, *labels], separators=(",", ":"))


def parse(raw: str) -> list[str]:
    """A field back into ``[metric, labels...]``; ``[]`` for anything else."""
    try:
        value = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        return []
    return value


def bucket(ms: int, bounds_s: tuple[float, ...]) -> str:
    """The smallest bound (as written in the field) that ``ms`` fits under, or ``+Inf``."""
    for bound in bounds_s:
        if ms <= bound * 1000:
            return repr(bound)
    return "+Inf"


def _observe(out: list[tuple[str, int]], metric: str, labels: tuple[str, ...], ms: int,
             bounds_s: tuple[float, ...]) -> None:
    ms = max(ms, 0)
    out.append((field(metric, *labels, bucket(ms, bounds_s)), 1))
    out.append((field(metric, *labels, "sum_ms"), ms))
    out.append((field(metric, *labels, "count"), 1))


def for_event(state: RunState, event: ev.Event) -> list[tuple[str, int]]:
    """What ``event`` adds to the counters, given the state just before it."""
    out: list[tuple[str, int]] = []
    outcome = OUTCOMES.get(type(event))
    if outcome is not None:
        step: int = event.step  # type: ignore[attr-defined]
        act = state.actions.get(step)
        tool = act.tool if act is not None else ""
        out.append((field(STEPS, state.agent, tool, outcome), 1))
        if isinstance(event, ev.ActionReconciled):
            if event.by == "":  # the tool's lookup answered (not an effect-free resend)
                out.append((field(LOOKUPS, event.resolution), 1))
                if event.resolution == "applied":  # it had happened: not sent again
                    out.append((field(DUPLICATES), 1))
        elif act is not None and act.status == "dispatched" and act.dispatched_at:
            _observe(out, STEP_DURATION, (tool,), event.ts - act.dispatched_at,
                     STEP_BUCKETS_S)
    elif isinstance(event, ev.Canceled):
        _observe(out, CANCEL_LATENCY_METRIC, (), event.latency_ms, CANCEL_BUCKETS_S)
    return out


def incr(client: redis.Redis | Any, metric: str, *labels: str, amount: int = 1) -> None:
    """Add to a counter the log does not record (``client`` may be a pipeline)."""
    client.hincrby(keys.METRICS, field(metric, *labels), amount)
