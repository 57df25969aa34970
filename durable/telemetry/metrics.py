"""Prometheus metrics of the whole system, read from Redis at scrape time.

Why Redis and not each process's memory: a step is taken by one of many worker processes,
a lookup answered by a worker or the reconciler, a run started by any producer. Counters
kept in a process would need every process scraped and summed, would reset on every
restart and would miss what short-lived processes did. Here:

- **Counters and histograms** live in the hash ``dx:metrics`` (``durable.log.counters``),
  incremented by ``append.lua`` in the same call as the events they count, so they equal a
  count over the logs, are shared by every process and survive restarts.
- **Gauges** (runs by state, the oldest waiting run per waiting state) are computed when
  scraped, from the per-state indexes (``dx:runs:<state>``): nothing to keep up to date.

:func:`exposition` is what ``/metrics`` serves (the console, or ``durable metrics``). A
worker's own ``--metrics-port`` serves that process's metrics only (``workers.metrics``),
under other names, so that summing over processes never counts a step twice.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import redis
from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from rq import Queue

from durable.flow.limit_usage import Use, usage
from durable.flow.tenants import OTHER, RUNS_STARTED
from durable.log import counters as c
from durable.log import keys
from durable.log.state import ALL_STATES, WAITING
from durable.log.store import EventLog
from durable.outcomes import NO_LOOKUP
from durable.queue import make_queue
from durable.settings import WorkerSettings
from durable.telemetry import orphans

if TYPE_CHECKING:
    from durable.client import Client

#: Waiting-for-external runs a scrape reads per shard to count the unsettled ones.
UNSETTLED_SCAN = 10_000
#: Runs of each non-terminal state a scrape examines per shard for orphans (the least
#: recently updated first: where orphans gather).
ORPHAN_SCAN = 10_000

#: Prometheus name, help and label names of each counter kept in ``dx:metrics``.
COUNTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    c.STEPS: ("durable_steps", "Step outcomes recorded in the logs (one per outcome event).",
              ("agent", "tool", "outcome")),
    c.DUPLICATES: ("durable_duplicates_suppressed",
                   "Effects not sent again because the ledger or the tool's lookup showed "
                   "they had happened.", ()),
    c.LOOKUPS: ("durable_lookups", "Answers of tools' lookups of unknown outcomes "
                "(applied, not_applied, unknown; error: the lookup raised).", ("answer",)),
    c.LEASE_EXPIRIES: ("durable_lease_expiries",
                       "Leases that expired instead of being released (their holder died "
                       "or stalled), counted when the run's lease is next taken.", ()),
    c.RECONCILER_ACTIONS: ("durable_reconciler_actions",
                           "What the reconciler did to due runs.", ("action",)),
    c.RUNS_ENDED: ("durable_runs_ended", "Runs that ended, by agent and terminal state "
                   "(completed, failed, canceled, expired), counted with the event that ended "
                   "them.", ("agent", "state")),
    c.RESUME_FAILURES: ("durable_resume_failures",
                        "Runs a worker took over and could not go on with (it quarantined "
                        "them): nondeterminism, agent_error, version, unsigned_rejection, "
                        "unreadable.", ("reason",)),
    c.MIGRATION_ERRORS: ("durable_migration_errors",
                         "Runs quarantined because an entry of their log could not be read "
                         "by this code: future_version, no_migration, unknown_type, "
                         "undecodable.", ("kind",)),
    RUNS_STARTED: ("durable_runs_started", "Runs started, by agent and tenant (the first "
                   "DURABLE_METRIC_TENANTS tenants by name, the rest as 'other').",
                   ("agent", "tenant")),
}

#: Prometheus name, help, label names and buckets of each histogram.
HISTOGRAMS: dict[str, tuple[str, str, tuple[str, ...], tuple[float, ...]]] = {
    c.STEP_DURATION: ("durable_step_duration_seconds",
                      "Dispatch to recorded outcome of a step, by tool.", ("tool",),
                      c.STEP_BUCKETS_S),
    c.CANCEL_LATENCY_METRIC: ("durable_cancel_latency_seconds",
                              "Cancel requested to run canceled.", (),
                              c.CANCEL_BUCKETS_S),
    c.UNKNOWN_DURATION: ("durable_unknown_outcome_seconds",
                         "Dispatch to reconciled of steps whose outcome was unknown (a lookup "
                         "after the deadline, an operator's settle).", (),
                         c.UNKNOWN_BUCKETS_S),
}


class DurableCollector(Collector):
    """Reads the shared counters and the state indexes on every scrape."""

    def __init__(self, client: redis.Redis, layout: keys.KeyLayout = keys.UNSHARDED,
                 queue: Queue | None = None, grace_ms: int = orphans.ORPHAN_GRACE_MS) -> None:
        self.redis = client
        self.keys = layout
        #: Where ready runs wait (the orphans' check): the default queue on ``client``
        #: unless given (``DURABLE_QUEUE``, ``DURABLE_QUEUE_URL``).
        self.queue = queue if queue is not None else \
            make_queue(client, WorkerSettings.model_fields["queue"].default)
        self.grace_ms = grace_ms

    def collect(self) -> Iterator[Metric]:
        raw: dict[Any, int] = defaultdict(int)
        for key in self.keys.metrics_keys():  # one hash per shard: their sum is the total
            for f, v in self.redis.hgetall(key).items():
                raw[f] += int(v)
        yield from self._counters(raw)
        yield from self._costs(raw)
        yield from self._histograms(raw)
        yield from self._gauges()
        yield from limit_metrics(usage(self.redis))

    def _counters(self, raw: dict[Any, Any]) -> Iterator[Metric]:
        values: dict[str, dict[tuple[str, ...], int]] = defaultdict(dict)
        for f, v in raw.items():
            parts = c.parse(_s(f))
            if parts and parts[0] in COUNTERS and len(parts) - 1 == len(COUNTERS[parts[0]][2]):
                values[parts[0]][tuple(parts[1:])] = int(v)
        for metric, (name, doc, labels) in COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=labels)
            for label_values, value in sorted(values[metric].items()):
                family.add_metric(label_values, value)
            if not labels and not values[metric]:
                family.add_metric((), 0)
            yield family

    def _costs(self, raw: dict[Any, Any]) -> Iterator[Metric]:
        """What model calls cost, and those of unknown cost, by agent and tenant label: a
        tenant without a label of its own (past ``DURABLE_METRIC_TENANTS``) is ``other``."""
        labeled = {_s(t) for t in self.redis.smembers(keys.TENANT_LABELS)}
        sums: dict[str, dict[tuple[str, str], int]] = {c.MODEL_COST: defaultdict(int),
                                                       c.UNCOSTED: defaultdict(int)}
        for f, v in raw.items():
            parts = c.parse(_s(f))
            if len(parts) == 3 and parts[0] in sums:
                tenant = parts[2] if not parts[2] or parts[2] in labeled else OTHER
                sums[parts[0]][(parts[1], tenant)] += int(v)
        cost = CounterMetricFamily(
            "durable_model_cost_usd", "What model calls cost, in US dollars, priced from their "
            "replies' usage by the price table they recorded (durable.costs), by agent and "
            "tenant.", labels=("agent", "tenant"))
        for labels, nanos in sorted(sums[c.MODEL_COST].items()):
            cost.add_metric(labels, nanos / 10**9)
        yield cost
        unknown = CounterMetricFamily(
            "durable_model_calls_uncosted", "Model calls whose cost is unknown (a model the "
            "price table does not know, no usage reported, no table): never counted as 0.",
            labels=("agent", "tenant"))
        for labels, n in sorted(sums[c.UNCOSTED].items()):
            unknown.add_metric(labels, n)
        yield unknown

    def _histograms(self, raw: dict[Any, Any]) -> Iterator[Metric]:
        for metric, (name, doc, labels, bounds) in HISTOGRAMS.items():
            series: dict[tuple[str, ...], dict[str, int]] = defaultdict(dict)
            for f, v in raw.items():
                parts = c.parse(_s(f))
                if parts and parts[0] == metric and len(parts) == len(labels) + 2:
                    series[tuple(parts[1:-1])][parts[-1]] = int(v)
            if not labels and not series:
                series[()] = {}
            family = HistogramMetricFamily(name, doc, labels=labels)
            for label_values, cells in sorted(series.items()):
                cumulative, buckets = 0, []
                for bound in bounds:
                    cumulative += cells.get(repr(bound), 0)
                    buckets.append((_le(bound), cumulative))
                # Every observation is in one bucket field ("+Inf" past the last bound).
                buckets.append(("+Inf", cumulative + cells.get("+Inf", 0)))
                family.add_metric(list(label_values), buckets, cells.get("sum_ms", 0) / 1000)
            yield family

    def _gauges(self) -> Iterator[Metric]:
        states = sorted(ALL_STATES)
        waiting = sorted(WAITING)
        shards = self.keys.shard_ids()
        aged = [*waiting, "outcome_unknown"]
        pipe = self.redis.pipeline(transaction=False)
        for state in states:
            for shard in shards:
                pipe.zcard(self.keys.runs_in_state(state, shard))
        for state in aged:
            for shard in shards:
                pipe.zrange(self.keys.runs_in_state(state, shard), 0, 0, withscores=True)
        replies = pipe.execute()
        per = len(shards)
        counts = [sum(int(n) for n in replies[i * per:(i + 1) * per])
                  for i in range(len(states))]
        firsts = replies[len(states) * per:]
        now = time.time()
        runs = GaugeMetricFamily("durable_runs", "Runs by state (from the state indexes).",
                                 labels=("state",))
        for state, count in zip(states, counts, strict=True):
            runs.add_metric((state,), count)
        yield runs
        oldest = GaugeMetricFamily(
            "durable_oldest_waiting_seconds",
            "Age of the longest-waiting run in each waiting state (0: none waits).",
            labels=("state",))
        ages = []
        for i in range(len(aged)):
            scores = [float(first[0][1]) for first in firsts[i * per:(i + 1) * per] if first]
            ages.append(max(now - min(scores) / 1000, 0.0) if scores else 0.0)
        for state, age in zip(waiting, ages, strict=False):
            oldest.add_metric((state,), age)
        yield oldest
        yield GaugeMetricFamily(
            "durable_oldest_outcome_unknown_seconds",
            "Age of the oldest run whose dispatched effect awaits reconciliation (0: none).",
            value=ages[-1])
        yield GaugeMetricFamily(
            "durable_runs_unsettled",
            "Runs whose unknown outcome no lookup can resolve: they wait for an operator's "
            "signed settle (durable runs --stuck).",
            value=self._projected("waiting_external", shards, lambda why: NO_LOOKUP in why))
        yield GaugeMetricFamily(
            "durable_runs_blocked_by_child",
            "Runs waiting for a child run that is quarantined (durable status names it and "
            "why; the agent's on_child_quarantined says what the wait does).",
            value=self._projected("waiting_child", shards,
                                  lambda why: why.startswith(keys.BLOCKED_BY_CHILD)))
        found = orphans.find(EventLog(self.redis, layout=self.keys), self.queue,
                             grace=self.grace_ms, limit=ORPHAN_SCAN)
        yield GaugeMetricFamily(
            "durable_runs_orphaned",
            "Runs not over that nothing will move on: no lease, on no ready list, no due "
            "entry a reconciler will reach, no answer awaited (durable runs --orphaned).",
            value=len(found))

    def _projected(self, state: str, shards: list[int | None],
                   says: Callable[[str], bool]) -> int:
        """The runs in ``state`` whose projected reason ``says`` so: the waiting_external
        ones whose lookup "cannot tell", the waiting_child ones a quarantined child blocks
        (one read of each shard's index, one pipelined HGET per run, at most
        ``UNSETTLED_SCAN`` per shard)."""
        ids = [rid for shard in shards for rid in self.redis.zrange(
            self.keys.runs_in_state(state, shard), 0, UNSETTLED_SCAN - 1)]
        if not ids:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for rid in ids:
            pipe.hget(self.keys.run(_s(rid)), "reason")
        return sum(1 for why in pipe.execute() if why and says(_s(why)))


def limit_metrics(found: list[Use]) -> Iterator[Metric]:
    """Per limit (its name: a bounded label; its keys are summed): calls in flight and
    waiting, the lowest adaptive share of the declared rate, and its decisions."""
    by: dict[str, list[Use]] = defaultdict(list)
    for u in found:
        by[u.limit].append(u)
    flight = GaugeMetricFamily("durable_limit_in_flight", "Calls holding a permit of the "
                               "limit now (all its keys).", labels=("limit",))
    waiting = GaugeMetricFamily("durable_limit_waiting", "Calls waiting for the limit "
                                "(all its keys).", labels=("limit",))
    share = GaugeMetricFamily("durable_limit_rate_share", "Lowest share of the declared "
                              "rate a key of the limit has after 429s (1: all of it).",
                              labels=("limit",))
    decided = CounterMetricFamily("durable_limit_decisions", "The limit's decisions: "
                                  "granted, waited (over the limit), throttled (a 429); "
                                  "reset when the limiter was idle for an hour.",
                                  labels=("limit", "decision"))
    for name, uses in sorted(by.items()):
        flight.add_metric((name,), sum(u.in_flight for u in uses))
        waiting.add_metric((name,), sum(u.waiting for u in uses))
        share.add_metric((name,), min(u.factor for u in uses))
        for what in ("granted", "waited", "throttled"):
            decided.add_metric((name, what), sum(getattr(u, what) for u in uses))
    yield from (flight, waiting, share, decided)


def registry_for(client: redis.Redis, layout: keys.KeyLayout, queue: Queue | None = None,
                 grace_ms: int = orphans.ORPHAN_GRACE_MS) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DurableCollector(client, layout, queue, grace_ms))
    return registry


def exposition(client: Client | redis.Redis,
               layout: keys.KeyLayout = keys.UNSHARDED) -> tuple[bytes, str]:
    """The system's metrics in Prometheus' text format: ``(body, content type)``.

    ``client`` is a :class:`durable.client.Client` (its log's layout, its queue and its
    settings' grace are used) or a ``redis.Redis`` on the log's server, whose data has the
    layout ``layout`` (and the default queue, on that server).
    """
    if isinstance(client, (redis.Redis, redis.RedisCluster)):
        return generate_latest(registry_for(client, layout)), CONTENT_TYPE_LATEST
    return generate_latest(registry_for(client.redis, client.log.keys, client.queue,
                                        orphans.grace_ms(client.settings))), CONTENT_TYPE_LATEST


def serve(client: redis.Redis, layout: keys.KeyLayout, host: str, port: int,
          queue: Queue | None = None, grace_ms: int = orphans.ORPHAN_GRACE_MS) -> None:
    """Serve ``/metrics`` in the foreground until interrupted (``durable metrics``)."""
    class _Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    app = make_wsgi_app(registry_for(client, layout, queue, grace_ms))
    with make_server(host, port, app, handler_class=_Quiet) as httpd:
        print(f"durable: metrics on http://{host}:{httpd.server_port}/metrics", flush=True)
        httpd.serve_forever()


def _le(bound: float) -> str:
    return repr(float(bound))


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
