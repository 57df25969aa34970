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
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import redis

from durable.log import events as ev
from durable.log import keys
from durable.log.state import TERMINAL, RunState

#: Histogram buckets (seconds): steps are model and API calls of 0.5-30 s, or no-ops.
STEP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                  120.0, 300.0)
#: Cancellation latency (request -> ``canceled``), seconds.
CANCEL_BUCKETS_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: How long an outcome was in doubt (dispatch -> reconciled), seconds: a lookup after the
#: deadline (seconds to minutes), an operator's settle (hours).
UNKNOWN_BUCKETS_S = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)

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
UNKNOWN_DURATION = "unknown_duration"
RUNS_ENDED = "runs_ended"
RESUME_FAILURES = "resume_failures"
MIGRATION_ERRORS = "migration_errors"
#: What model calls cost (billionths of a dollar) and those of unknown cost, by agent and
#: tenant: the tenant as the run names it (the exporter folds it into a bounded label).
MODEL_COST = "model_cost_nanos"
UNCOSTED = "model_calls_uncosted"


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
    # No "count" field: it is the buckets' sum, which the exporter adds up (a field fewer
    # to increment per step; hashes written with one still read the same).


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
            if act is not None and act.dispatched_at:
                _observe(out, UNKNOWN_DURATION, (), event.ts - act.dispatched_at,
                         UNKNOWN_BUCKETS_S)
            if event.by == "":  # the tool's lookup answered (not an effect-free resend)
                out.append((field(LOOKUPS, event.resolution), 1))
                if event.resolution == "applied":  # it had happened: not sent again
                    out.append((field(DUPLICATES), 1))
        elif act is not None and act.status == "dispatched" and act.dispatched_at:
            _observe(out, STEP_DURATION, (tool,), event.ts - act.dispatched_at,
                     STEP_BUCKETS_S)
        if isinstance(event, ev.ActionSucceeded) and act is not None and act.model:
            cost = event.cost
            if cost is not None and cost.usd:
                nanos = int((Decimal(cost.usd) * 10**9).to_integral_value(ROUND_HALF_UP))
                out.append((field(MODEL_COST, state.agent, state.tenant), nanos))
            else:
                out.append((field(UNCOSTED, state.agent, state.tenant), 1))
    elif isinstance(event, ev.Canceled):
        _observe(out, CANCEL_LATENCY_METRIC, (), event.latency_ms, CANCEL_BUCKETS_S)
    return out


def for_end(before: str, after: RunState) -> list[tuple[str, int]]:
    """A run's end, counted once (no event leaves a terminal state): by agent and state,
    whichever event ended it (``completed``; ``expired`` by a wait's expiry too)."""
    if after.state in TERMINAL and before not in TERMINAL:
        return [(field(RUNS_ENDED, after.agent, after.state), 1)]
    return []


def migration_error(reason: str) -> list[tuple[str, int]]:
    """What a log entry that could not be read (``DecodeError.reason``) adds, counted with
    the quarantine it causes: its kind, ``future_version`` (written by newer code),
    ``no_migration`` (no upcaster from its version), ``unknown_type`` or ``undecodable``."""
    kind = "future_version" if reason.startswith("written by a newer schema version") else \
        "no_migration" if reason.startswith("no migration for") else \
        "unknown_type" if reason.startswith("unknown event type") else "undecodable"
    return [(field(MIGRATION_ERRORS, kind), 1)]


def resume_failure(reason: str) -> list[tuple[str, int]]:
    """A worker took a run over and could not go on (quarantined it): ``nondeterminism``,
    ``agent_error`` (the agent raised while re-observing), ``version`` (its version policy),
    ``unsigned_rejection``, ``unreadable`` (its log), ``chain_broken`` (its log does not
    chain from its last checkpoint, ``durable.log.chain``)."""
    return [(field(RESUME_FAILURES, reason), 1)]


def incr(client: redis.Redis | Any, metric: str, *labels: str, amount: int = 1) -> None:
    """Add to a counter the log does not record (``client`` may be a pipeline)."""
    client.hincrby(keys.METRICS, field(metric, *labels), amount)
