"""``python -m bench.sessions [--quick]``: what a start in a named session costs (not part
of ``python -m bench``; about 15 s, its own embedded server).

A start with ``session=`` reads the session's head (``HGETALL``), reads the head run's
state when there is one, and claims the session (``session_claim.lua``) before it writes
``run_started`` as any start does (``durable.controls.sessions``). Measured, interleaved over
rounds, on one connection, runs not enqueued (the start alone):

- a plain start;
- a start with ``continue_from`` (one projection read more);
- the first turn of a new session (head read and claim);
- the next turn of a session whose latest run has ended (head read, its state, claim).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.common import AGENTS, settings_for
from durable.client import Client
from durable.testing import Server, Worker

AGENT, INPUT = "count", {"steps": 1}


def _timed(fn: Any, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n * 1e6


def run(quick: bool = False) -> dict[str, Any]:
    n, rounds = (200, 2) if quick else (1000, 3)
    srv = Server(fsync="everysec").start()
    try:
        client = Client(settings_for(srv.url), srv.client())
        client.start(AGENT, INPUT, run_id="done")  # a completed run, for continue_from
        Worker(srv.url, burst=True, DURABLE_AGENTS=AGENTS).wait(120)
        if client.status("done").state != "completed":
            raise RuntimeError("the run to continue from did not complete")
        res: dict[str, list[float]] = {"plain": [], "continue_from": [], "first_turn": [],
                                       "next_turn": []}
        for k in range(rounds):
            res["plain"].append(_timed(lambda i, k=k: client.start(
                AGENT, INPUT, run_id=f"p{k}-{i}", enqueue=False), n))
            res["continue_from"].append(_timed(lambda i, k=k: client.start(
                AGENT, INPUT, run_id=f"c{k}-{i}", enqueue=False, continue_from="done"), n))
            res["first_turn"].append(_timed(lambda i, k=k: client.start(
                AGENT, INPUT, run_id=f"f{k}-{i}", enqueue=False, session=f"s{k}-{i}"), n))
            for i in range(n):  # the first turns end (untimed)
                client.cancel(f"f{k}-{i}")
            res["next_turn"].append(_timed(lambda i, k=k: client.start(
                AGENT, INPUT, run_id=f"n{k}-{i}", enqueue=False, session=f"s{k}-{i}"), n))
        return {"starts_per_round": n, "rounds": rounds,
                **{name: round(statistics.median(v), 1) for name, v in res.items()}}
    finally:
        srv.stop()


def markdown(res: dict[str, Any]) -> str:
    plain = res["plain"]
    lines = [f"## Starts in named sessions ({res['starts_per_round']} starts x "
             f"{res['rounds']} rounds, one connection, not enqueued)\n",
             "| start | µs per start (median of rounds) | against a plain start |",
             "|---|---:|---:|"]
    for name, label in (("plain", "plain"), ("continue_from", "`continue_from=RUN`"),
                        ("first_turn", "`session=` (a new session)"),
                        ("next_turn", "`session=` (the next turn)")):
        lines.append(f"| {label} | {res[name]} | {res[name] / plain:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sessions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    print(markdown(run(quick=args.quick)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
