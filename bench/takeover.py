"""Item: time from a worker's death to its runs' resumption (``durable.telemetry.liveness``).

A worker process takes N runs (``count`` with one 60 s ``noop`` call: each run is held,
inside its call), a second worker and a reconciler (default interval and liveness TTL)
stand by; the first worker is SIGKILLed. For each run, the time until its lease names the
second worker (that worker took the run with a new epoch and is driving it) is recorded,
polling every 5 ms. Default settings: ``DURABLE_LIVENESS_TTL_MS`` 600, lease TTL 5 s.
Repeated ``rounds`` times (a fresh pair of workers each), every sample reported.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from bench.common import fresh, median, percentile, settings_for, worker
from durable.client import Client
from durable.log import keys
from durable.testing import Reconciler, wait_for


def _owners(r: redis.Redis, runs: list[str]) -> list[str]:
    pipe = r.pipeline(transaction=False)
    for run in runs:
        pipe.get(keys.UNSHARDED.lease(run))
    return [v.decode().rsplit("|", 1)[0] if v else "" for v in pipe.execute()]


def _alive(r: redis.Redis) -> set[str]:
    members = {m.decode() for m in r.smembers(keys.WORKERS)}
    return {m for m in members if r.exists(keys.alive(m))}


def one_round(url: str, r: redis.Redis, n: int, tag: str) -> list[float]:
    client = Client(settings_for(url), r)
    runs = [f"{tag}-{i}" for i in range(n)]
    first = worker(url, DURABLE_CONCURRENCY=str(n + 16), DURABLE_LEASE_TTL_MS="5000")
    second = None
    try:
        client.start_many("count", [{"steps": 1, "sleep_s": 60}] * n, run_ids=runs)
        if not wait_for(lambda: all(_owners(r, runs)), 60, 0.05):
            raise TimeoutError("the first worker did not take every run")
        dead = _owners(r, runs)[0]
        second = worker(url, DURABLE_CONCURRENCY=str(n + 16), DURABLE_LEASE_TTL_MS="5000")
        if not wait_for(lambda: len(_alive(r) - {dead}) == 1, 30, 0.02):
            raise TimeoutError("the second worker did not announce itself")
        (survivor,) = _alive(r) - {dead}
        first.kill()
        killed = time.monotonic()
        took: dict[str, float] = {}
        while len(took) < n and time.monotonic() - killed < 30:
            now = time.monotonic() - killed
            for run, owner in zip(runs, _owners(r, runs), strict=True):
                if owner == survivor:
                    took.setdefault(run, now)
            time.sleep(0.005)
        return sorted(took.values())
    finally:
        first.stop()
        if second is not None:
            second.stop()


def run(servers: Any, quick: bool = False, rounds: int | None = None,
        log: Any = print) -> dict[str, Any]:
    n = 50 if quick else 200
    rounds = rounds or (1 if quick else 3)
    srv = servers.get("everysec")
    r: redis.Redis = srv.client()
    fresh(r)
    rec = Reconciler(srv.url, interval=0.5, DURABLE_AGENTS="examples.agents")
    samples: list[float] = []
    per_round = []
    try:
        for i in range(rounds):
            took = one_round(srv.url, r, n, f"tk{i}")
            per_round.append({"n": len(took), "p50_s": median(took), "max_s": max(took)})
            samples += took
            log(f"  takeover round {i + 1}: {len(took)}/{n} runs resumed, p50 "
                f"{median(took):.3f} s, max {max(took):.3f} s")
            fresh(r)
    finally:
        rec.stop()
        r.close()
    return {"runs": n, "rounds": rounds, "resumed": len(samples),
            "p50_s": median(samples), "p95_s": percentile(samples, 95),
            "max_s": max(samples), "per_round": per_round,
            "samples_s": [round(x, 4) for x in samples]}
