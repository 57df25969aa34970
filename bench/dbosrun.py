"""DBOS side of ``iobound``, run as a process of its own (``python -m bench.dbosrun``).

DBOS is a process-wide singleton with its own threads and logging, so it is kept out of
the benchmark process. One launch against ``--url`` (a PostgreSQL system database), then
``--rounds`` rounds of each mode, alternating, each printing one JSON line on stdout:

- ``threads``: ``@DBOS.workflow()`` of ``--steps`` sequential ``@DBOS.step()`` calls, each
  ``time.sleep(--sleep)``; ``--runs`` of them started at once with ``DBOS.start_workflow``
  (DBOS runs each on a thread of its executor), then every handle's ``get_result()``.
- ``async``: the same as ``async def`` workflow and steps (``asyncio.sleep``), started with
  ``DBOS.start_workflow_async`` in one event loop.

Wall time is from the first start to the last result; ``start_s`` is how long the starts
took; ``rss_peak_mb`` is this process's peak RSS during the round (sampled every 20 ms),
``cpu_s`` its CPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import threading
import time
import uuid
from typing import Any

import psutil
from dbos import DBOS, DBOSConfig, SetWorkflowID

SLEEP_S = 0.5


@DBOS.step()
def sleep_step(i: int) -> int:
    time.sleep(SLEEP_S)
    return i


@DBOS.workflow()
def sleepy(steps: int) -> int:
    for i in range(steps):
        sleep_step(i)
    return steps


@DBOS.step()
async def sleep_step_async(i: int) -> int:
    await asyncio.sleep(SLEEP_S)
    return i


@DBOS.workflow()
async def sleepy_async(steps: int) -> int:
    for i in range(steps):
        await sleep_step_async(i)
    return steps


class RssPeak:
    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.peak = self.proc.memory_info().rss
        self.threads = self.proc.num_threads()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.proc.memory_info().rss)
            self.threads = max(self.threads, self.proc.num_threads())

    def __enter__(self) -> RssPeak:
        t = self.proc.cpu_times()
        self.cpu_s = -(t.user + t.system)
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        t = self.proc.cpu_times()
        self.cpu_s += t.user + t.system


def run_threads(runs: int, steps: int, tag: str) -> dict[str, Any]:
    with RssPeak() as mem:
        t0 = time.perf_counter()
        handles = []
        for i in range(runs):
            with SetWorkflowID(f"{tag}-{i}"):
                handles.append(DBOS.start_workflow(sleepy, steps))
        started = time.perf_counter()
        for h in handles:
            assert h.get_result() == steps
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "start_s": started - t0, "rss_peak_mb": mem.peak / 2**20,
            "threads_peak": mem.threads, "cpu_s": mem.cpu_s}


async def _run_async(runs: int, steps: int, tag: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    handles = []
    for i in range(runs):
        with SetWorkflowID(f"{tag}-{i}"):
            handles.append(await DBOS.start_workflow_async(sleepy_async, steps))
    started = time.perf_counter()
    results = await asyncio.gather(*(h.get_result() for h in handles))
    assert all(r == steps for r in results)
    return time.perf_counter() - t0, started - t0


def run_async(runs: int, steps: int, tag: str) -> dict[str, Any]:
    with RssPeak() as mem:
        wall, start = asyncio.run(_run_async(runs, steps, tag))
    return {"wall_s": wall, "start_s": start, "rss_peak_mb": mem.peak / 2**20,
            "threads_peak": mem.threads, "cpu_s": mem.cpu_s}


def main(argv: list[str] | None = None) -> int:
    global SLEEP_S
    p = argparse.ArgumentParser(prog="python -m bench.dbosrun")
    p.add_argument("--url", required=True)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--modes", default="threads,async")
    p.add_argument("--pool", type=int, default=None, help="sys_db_pool_size (DBOS default 20)")
    args = p.parse_args(argv)
    SLEEP_S = args.sleep
    logging.getLogger().setLevel(logging.WARNING)
    config: DBOSConfig = {"name": "bench-iobound", "system_database_url": args.url,
                          "log_level": "WARNING"}
    if args.pool:
        config["sys_db_pool_size"] = args.pool
    t0 = time.perf_counter()
    DBOS(config=config)
    DBOS.launch()
    print(json.dumps({"launch_s": time.perf_counter() - t0,
                      "rss_idle_mb": psutil.Process().memory_info().rss / 2**20}), flush=True)
    modes = [m for m in args.modes.split(",") if m]
    try:
        for rnd in range(args.rounds):
            for mode in modes:
                tag = f"r{rnd}-{mode}-{uuid.uuid4().hex[:6]}"
                fn = run_threads if mode == "threads" else run_async
                res = fn(args.runs, args.steps, tag)
                print(json.dumps({"mode": mode, "round": rnd + 1, **res}), flush=True)
    finally:
        DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
