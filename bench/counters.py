"""What the shared Prometheus counters cost: a step's append with and without them, and a
scrape of ``durable.telemetry.metrics.exposition``.

    python -m bench.counters [--runs 200] [--steps 20] [--rounds 5]

Each step is one ``EventLog.commit`` of what a worker writes per step (the previous step's
outcome, the next intent, its dispatch and ledger claim), on an embedded server
(``appendfsync everysec``). "without" replaces ``counters.for_event`` with one that counts
nothing, so the script call carries no increments; the two are interleaved round by round
and the medians reported.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from durable.client import Client
from durable.log import counters
from durable.log import events as ev
from durable.log.store import Spec
from durable.settings import Settings
from durable.telemetry.metrics import exposition
from durable.testing import Server


def _steps(client: Client, prefix: str, runs: int, steps: int) -> float:
    """Seconds per step over ``runs`` runs of ``steps`` steps."""
    handles = []
    for i in range(runs):
        run = client.start("count", {"steps": steps}, run_id=f"{prefix}{i}", enqueue=False)
        handles.append(client.log.load(run.run_id, actor="bench"))
    began = time.perf_counter()
    for handle in handles:
        for step in range(1, steps + 1):
            key = f"{handle.run_id}:{step}"
            specs: list[Spec] = []
            if step > 1:
                specs.append(Spec(ev.ActionSucceeded, {"step": step - 1,
                                                       "key": f"{handle.run_id}:{step - 1}",
                                                       "result": {"n": step - 1}}))
            specs += [Spec(ev.StepDecided, {"step": step, "tool": "noop", "key": key,
                                            "args": {"n": step}}),
                      Spec(ev.ActionDispatched, {"step": step, "key": key,
                                                 "deadline": 2**40})]
            client.log.commit(handle, specs, ledger=[("c", key, "claimed|0")], dispatch=True)
    return (time.perf_counter() - began) / (runs * steps)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tools", type=int, default=100,
                   help="before the scrape, add series for this many more tools (x 6 "
                        "outcomes x 10 agents, and a duration histogram each)")
    args = p.parse_args(argv)
    real = counters.for_event

    def nothing(state: Any, event: Any) -> list[tuple[str, int]]:
        return []

    with_s: list[float] = []
    without_s: list[float] = []
    with Server(fsync="everysec") as srv:
        r = srv.client()
        client = Client(Settings.from_env(redis_url=srv.url, agents="examples.agents"), r)
        for n in range(args.rounds):
            counters.for_event = nothing
            without_s.append(_steps(client, f"without{n}-", args.runs, args.steps))
            counters.for_event = real
            with_s.append(_steps(client, f"with{n}-", args.runs, args.steps))
        pipe = r.pipeline(transaction=False)
        for t in range(args.tools):
            for a in range(10):
                for outcome in set(counters.OUTCOMES.values()):
                    counters.incr(pipe, counters.STEPS, f"agent{a}", f"tool{t}", outcome)
            for bound in counters.STEP_BUCKETS_S:
                counters.incr(pipe, counters.STEP_DURATION, f"tool{t}", repr(bound))
        pipe.execute()
        fields = r.hlen("dx:metrics")
        began = time.perf_counter()
        scrapes = 50
        for _ in range(scrapes):
            body, _ctype = exposition(r)
        scrape_ms = (time.perf_counter() - began) / scrapes * 1000
        r.close()
    w, wo = statistics.median(with_s) * 1e6, statistics.median(without_s) * 1e6
    print(f"per step, median of {args.rounds} rounds of {args.runs}x{args.steps} steps:")
    print(f"  without counters {wo:8.1f} us")
    print(f"  with counters    {w:8.1f} us  ({(w - wo) / wo:+.1%})")
    print(f"scrape (exposition): {scrape_ms:.2f} ms for {fields} counter fields and "
          f"{args.rounds * args.runs * 2} runs ({len(body)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
