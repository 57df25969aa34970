"""Limits shared by every worker, end to end: real worker and reconciler processes, the real
Redis server, and a local HTTP provider (``durable.testing.provider``) that counts what it receives
and answers 429 past its own quota. The issue's sizes (1,000 runs at 100 requests/min) are
scaled down to keep each test under a minute; ``python -m bench limits`` runs the full
size."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import durable.testing.provider  # noqa: F401  (registers the agents in this process too)
from durable.client import Client
from durable.flow.limit_usage import usage
from durable.telemetry.metrics import exposition
from durable.testing import wait_for
from durable.testing.provider import Provider
from tests.conftest import ReconcilerFactory, WorkerFactory, run_durable

AGENTS = "examples.agents,tests.agents.basic,durable.testing.provider"


@pytest.fixture()
def provider() -> Iterator[Provider]:
    p = Provider(latency_s=0.1)
    yield p.start()
    p.stop()


def _limits(monkeypatch: pytest.MonkeyPatch, provider: Provider, **env: Any) -> None:
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    monkeypatch.setenv("PROVIDER_URL", provider.url)
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))


def _stats(provider: Provider) -> dict[str, Any]:
    with urllib.request.urlopen(provider.url + "/stats") as reply:
        return dict(json.loads(reply.read()))


def _completed(client: Client) -> int:
    return int(client.redis.zcard(client.log.keys.runs_in_state("completed")))


def test_runs_obey_the_providers_limits_and_a_killed_worker_leaks_no_permit(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
    """150 runs, 2 workers, a provider that takes 20 requests per second and 5 at once
    (the limit declares the same). Window: one worker is SIGKILLed once a third of the
    runs are done, with calls of its own in flight holding permits; its runs are taken
    over. The provider sees nothing over its limits, answers no 429, every run completes,
    and the limit's count of calls in flight returns to 0."""
    n, rate, in_flight = 150, 20, 5
    provider.quota.update(rate=rate, per_s=1.0, in_flight=in_flight)
    # The margin absorbs the delay between a grant and the provider's receipt, which on a
    # loaded 2-core machine reaches a few hundred ms.
    _limits(monkeypatch, provider, LIMIT_RATE=rate, LIMIT_IN_FLIGHT=in_flight,
            LIMIT_PER_S=1.0, LIMIT_MARGIN_S=0.5)
    client.start_many("calls_provider", [{"calls": 1}] * n)
    reconciler()
    doomed = worker()
    worker()
    assert wait_for(lambda: _completed(client) >= n // 3, 30)
    doomed.kill()
    assert wait_for(lambda: _completed(client) == n, 50), client.counts()
    stats = _stats(provider)
    assert stats["rejected"] == 0, stats
    assert stats["max_in_flight"] <= in_flight, stats
    assert stats["max_in_window"] <= rate, stats
    assert stats["accepted"] >= n
    assert wait_for(lambda: [u.in_flight for u in usage(client.redis)] == [0], 10), \
        usage(client.redis)
    [use] = usage(client.redis)
    assert use.waited > 0 and use.granted >= n, use  # the limit did make calls wait
    shown = run_durable("limits", env=dict(os.environ)).stdout
    assert "provider" in shown and "p1" in shown, shown
    text = exposition(client)[0].decode()
    assert 'durable_limit_in_flight{limit="provider"} 0.0' in text, text
    assert f'durable_limit_decisions_total{{decision="granted",limit="provider"}} ' \
           f'{float(use.granted)}' in text, text


def test_a_token_quota_is_kept_and_a_lowered_quota_is_followed(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token limit of 10,000 per second, replies of 1,000 tokens: the provider never sees
    more than the quota in any second, within one reply (it accepts that much more), and
    answers no 429. Then the provider halves its
    quota and answers 429 with Retry-After past it: the fleet's limiter lowers its rate
    and the 429s stop within a period; every run completes."""
    tokens = 10_000
    provider.quota.update(tokens=tokens + 1000, per_s=1.0, retry_after_s=0.5)
    _limits(monkeypatch, provider, LIMIT_TOKENS=tokens, LIMIT_PER_S=1.0, LIMIT_MARGIN_S=0.25)
    client.start_many("asks_model", [{"tokens": 1000}] * 40)
    reconciler()
    worker()
    worker()
    assert wait_for(lambda: _completed(client) == 40, 40), client.counts()
    stats = _stats(provider)
    assert stats["rejected"] == 0 and stats["max_tokens_in_window"] <= tokens + 1000, stats

    provider.quota.update(tokens=tokens // 2)
    client.start_many("asks_model", [{"tokens": 1000}] * 40)
    assert wait_for(lambda: _completed(client) == 80, 40), client.counts()
    stats = _stats(provider)
    assert stats["rejected"] >= 1, stats  # it did push back
    [use] = usage(client.redis)
    assert use.throttled >= 1 and use.factor < 1, use
    # Followed within a period: after the first second of 429s, at most a few probes of
    # the regained rate meet one again.
    assert stats["rejected"] <= 12, stats


def test_a_parallel_group_over_a_limit_waits_and_its_calls_go_out_within_it(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs whose four calls go out at once, under a limit of 3 in flight: a group that
    does not fit records its intents and waits; its calls then go out one by one within
    the limit. The provider (3 at once) answers no 429 and every run completes."""
    provider.quota.update(in_flight=3)
    _limits(monkeypatch, provider, LIMIT_IN_FLIGHT=3)
    runs = [s.run_id for s in client.start_many("fans_provider", [{"calls": 4}] * 10)]
    reconciler()
    worker()
    assert wait_for(lambda: _completed(client) == 10, 50), client.counts()
    stats = _stats(provider)
    assert stats["rejected"] == 0 and stats["max_in_flight"] <= 3, stats
    assert stats["accepted"] == 40, stats
    assert all(client.status(r).result == {"calls": 4} for r in runs)
    [use] = usage(client.redis)
    assert use.waited >= 10 and use.in_flight == 0, use  # every group waited once at least


def _span(client: Client, run: str) -> tuple[int, int]:
    """When the run took its first step and when it ended (its log's times)."""
    events = [e.event for e in client.events(run) if e.event is not None]
    first = next(e.ts for e in events if type(e).__name__ == "StepDecided")
    return first, events[-1].ts


def test_at_most_n_runs_per_key_are_in_flight_and_the_others_wait(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-key run concurrency: 6 runs of owner u1 and 3 of u2 (two 0.1 s calls each), at
    most 2 runs per owner in flight, 2 workers. From the logs: no three runs of one owner
    ever overlap; the waiting runs show why; every run completes and every place is free."""
    _limits(monkeypatch, provider, RUN_LIMIT_IN_FLIGHT=2)
    u1 = [s.run_id for s in client.start_many("per_owner", [{"calls": 2}] * 6, owner="u1")]
    u2 = [s.run_id for s in client.start_many("per_owner", [{"calls": 2}] * 3, owner="u2")]
    reconciler()
    worker()
    worker()
    assert wait_for(lambda: any("waits for limit per-owner[u1]" in r.reason
                                for r in client.runs("pending", owner="u1")), 20)
    assert wait_for(lambda: _completed(client) == 9, 50), client.counts()
    for runs in (u1, u2):
        spans = [_span(client, r) for r in runs]
        most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
        assert most <= 2, spans
    assert [u.in_flight for u in usage(client.redis) if u.limit == "per-owner"] == [0, 0]
