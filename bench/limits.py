"""What flow control costs and what it keeps: limiter decisions per second, the cost per
step, and the issue's full-size fleet against a provider with quotas.

    python -m bench.limits [--decisions-s 3] [--steps 400]
                           [--runs 1000] [--rate 100] [--per-s 60] [--in-flight 20]
                           [--skip-fleet]

1. **Decisions**: one process takes and gives back permits of one limiter (in flight, rate
   and tokens declared, never binding) through ``limit_take.lua``/``limit_release.lua`` for
   ``--decisions-s`` seconds: take+release pairs per second and the median pair.
2. **Cost per step**: ``--steps`` one-call runs of ``calls_provider`` against a provider
   with no latency, one worker, without a limit and with one that never binds: the
   runs' wall time each way (interleaved, twice).
3. **The fleet** (the issue's test at full size): ``--runs`` runs, 2 workers, a provider
   that accepts ``--rate`` requests per ``--per-s`` seconds and ``--in-flight`` at once
   (the limit declares the same); one worker is SIGKILLed a third of the way. Reported:
   the provider's 429s, its max in flight and max per window against the limit, the
   permits left at the end and the wall time against the ideal (runs / rate x period).
4. **The small tenant** (2 workers running; ``--big`` runs of tenant A, then 10 of tenant
   B, one 0.01 s step each): B's wait from its start to its first step, and how many of
   A's runs were done when B's were.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from bench.common import median, settings_for, worker
from durable.client import Client
from durable.flow.limit_usage import usage
from durable.flow.limits import Limit, Limiter
from durable.log.state import RunState
from durable.log.store import now_ms
from durable.testing import Server, wait_for
from durable.testing.provider import Provider

AGENTS = "examples.agents,durable.testing.provider"


class _Tool:
    name = "bench"
    limits = (Limit("bench", in_flight=1_000_000, rate=1_000_000_000, tokens=10**12,
                    per_s=60),)

    def estimate_tokens(self, args: dict[str, Any]) -> int:
        return 100


def decisions(url: str, seconds: float) -> dict[str, Any]:
    import redis

    r = redis.Redis.from_url(url)
    r.flushall()
    lim = Limiter(r)
    state, tool = RunState(run_id="bench"), _Tool()
    pairs: list[float] = []
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        step += 1
        began = time.perf_counter()
        assert lim.take(state, None, tool, step, {}, int(time.time() * 1000) + 60_000) is None
        lim.release("bench", step, [])
        pairs.append(time.perf_counter() - began)
    r.close()
    return {"pairs_per_s": round(len(pairs) / seconds), "decisions_per_s":
            round(2 * len(pairs) / seconds),
            "median_pair_ms": round(median(pairs) * 1000, 3)}


def _fleet_env(provider: Provider, **limits: Any) -> dict[str, str]:
    env = {"DURABLE_AGENTS": AGENTS, "PROVIDER_URL": provider.url}
    env.update({k: str(v) for k, v in limits.items()})
    return env


def _wall(url: str, runs: int, limited: bool) -> float:
    provider = Provider(latency_s=0.0).start()
    client = Client(settings_for(url, agents=AGENTS))
    client.redis.flushall()
    env = _fleet_env(provider, **({"LIMIT_RATE": 10**9, "LIMIT_IN_FLIGHT": 10**6}
                                  if limited else {}))
    os.environ.update(env)
    try:
        client.start_many("calls_provider", [{"calls": 1}] * runs)
        began = time.monotonic()
        w = worker(url, **env)
        completed = client.log.keys.runs_in_state("completed")
        assert wait_for(lambda: client.redis.zcard(completed) == runs,
                        300), client.counts()
        took = time.monotonic() - began
        w.stop()
        return took
    finally:
        for k in env:
            os.environ.pop(k, None)
        provider.stop()
        client.close()


def cost_per_step(url: str, runs: int) -> dict[str, Any]:
    plain, limited = [], []
    for _ in range(2):
        plain.append(_wall(url, runs, False))
        limited.append(_wall(url, runs, True))
    return {"runs": runs, "without_limit_s": [round(x, 2) for x in plain],
            "with_limit_s": [round(x, 2) for x in limited],
            "extra_ms_per_step": round((median(limited) - median(plain)) / runs * 1000, 3)}


def fleet(url: str, runs: int, rate: int, per_s: float, in_flight: int) -> dict[str, Any]:
    from durable.testing import Reconciler

    provider = Provider(rate=rate, per_s=per_s, in_flight=in_flight, latency_s=0.2).start()
    client = Client(settings_for(url, agents=AGENTS))
    client.redis.flushall()
    env = _fleet_env(provider, LIMIT_RATE=rate, LIMIT_IN_FLIGHT=in_flight, LIMIT_PER_S=per_s)
    os.environ.update(env)
    procs: list[Any] = []
    try:
        began = time.monotonic()
        client.start_many("calls_provider", [{"calls": 1}] * runs)
        procs = [Reconciler(url, env=env),
                 worker(url, **env), worker(url, **env)]

        def done() -> int:
            return int(client.redis.zcard(client.log.keys.runs_in_state("completed")))

        assert wait_for(lambda: done() >= runs // 3, 3600)
        procs[1].kill()
        assert wait_for(lambda: done() == runs, 3600), client.counts()
        took = time.monotonic() - began
        wait_for(lambda: all(u.in_flight == 0 for u in usage(client.redis)), 60)
        with provider.lock:
            stats = {k: v for k, v in provider.stats.items() if k != "keys"}
        left = sum(u.in_flight for u in usage(client.redis))
        [use] = usage(client.redis)
        return {"runs": runs, "limit": {"rate": rate, "per_s": per_s, "in_flight": in_flight},
                "provider": stats, "permits_left": left, "waited": use.waited,
                "wall_s": round(took, 1), "ideal_s": round(runs / rate * per_s, 1)}
    finally:
        for p in procs:
            p.stop()
        for k in env:
            os.environ.pop(k, None)
        provider.stop()
        client.close()


def small_tenant(url: str, big: int) -> dict[str, Any]:
    from durable.log import events as ev

    client = Client(settings_for(url))
    client.redis.flushall()
    procs: list[Any] = []
    try:
        procs = [worker(url), worker(url)]
        warm = client.start("count", {"steps": 1}).run_id  # the workers are up
        assert client.wait(warm, 60).state == "completed"
        a = client.start_many("count", [{"steps": 1, "sleep_s": 0.01}] * big, tenant="A")
        waiting_a = int(client.redis.zcard(client.log.keys.runs_in_state("pending")))
        started = now_ms()  # B arrives behind A's backlog
        b = [s.run_id for s in client.start_many("count", [{"steps": 1, "sleep_s": 0.01}] * 10,
                                                 tenant="B")]
        k = client.log.keys
        assert wait_for(lambda: all(client.redis.hget(k.run(r), "state") == b"completed"
                                    for r in b), 600)
        pipe = client.redis.pipeline(transaction=False)
        for s in a:
            pipe.hget(client.log.keys.run(s.run_id), "state")
        done_a = sum(1 for x in pipe.execute() if x == b"completed")
        waits = [next(e.event.ts for e in client.events(r)
                      if isinstance(e.event, ev.StepDecided)) - started for r in b]
        return {"big": big, "big_pending_when_small_started": waiting_a, "small": 10,
                "small_first_step_ms": {
            "median": median(waits), "max": max(waits)}, "big_done_when_small_done": done_a}
    finally:
        for p in procs:
            p.stop()
        client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.limits", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--decisions-s", type=float, default=3.0)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--rate", type=int, default=100)
    p.add_argument("--per-s", type=float, default=60.0)
    p.add_argument("--in-flight", type=int, default=20)
    p.add_argument("--skip-fleet", action="store_true")
    p.add_argument("--big", type=int, default=10_000, help="tenant A's runs (item 4)")
    args = p.parse_args(argv)
    srv = Server(fsync="everysec").start()
    try:
        out: dict[str, Any] = {"decisions": decisions(srv.url, args.decisions_s)}
        print(json.dumps(out["decisions"]), flush=True)
        out["cost"] = cost_per_step(srv.url, args.steps)
        print(json.dumps(out["cost"]), flush=True)
        if not args.skip_fleet:
            out["fleet"] = fleet(srv.url, args.runs, args.rate, args.per_s, args.in_flight)
            print(json.dumps(out["fleet"]), flush=True)
        out["small_tenant"] = small_tenant(srv.url, args.big)
        print(json.dumps(out["small_tenant"]), flush=True)
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
