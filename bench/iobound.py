"""Item: many I/O-bound runs at once, side by side with asyncio and DBOS.

The load: ``RUNS`` runs (1,000) of ``STEPS`` (3) sequential steps whose tool sleeps
``SLEEP_S`` (0.5 s): the ``count`` agent with ``sleep_s`` (its ``noop`` tool waits on its
cancel token). The ideal wall time is ``STEPS * SLEEP_S`` = 1.5 s: every run at once.
Configurations:

- ``durable, 2 workers x 500``: two ``durable worker`` processes with
  ``DURABLE_CONCURRENCY=500`` against the ``appendfsync everysec`` server; together they
  can hold every run. The workers are started and ready first (not timed); the clock starts
  before this process starts the runs (one ``Client.start_many`` call, as a producer with a
  batch would) and stops at the last run's last write (its projection's ``last`` entry id,
  on the server's clock; the server's clock also marks the start). Reported: wall, wall /
  ideal, how long the starts took, per-run latency (``run_started`` -> last write) and
  queue wait (``run_started`` -> the worker's first write), runs taken per worker, each
  worker's peak RSS (psutil, every 20 ms) and threads while it holds the runs, Redis round
  trips per step counted inside the workers (``bench.rtcount``: a command, pipeline or
  script call is one; RQ and heartbeats included), all commands the server processed per
  step (``INFO`` ``total_commands_processed``, which also counts the commands inside
  scripts and this process's starts), and the problems the worker logs show. The workers'
  redis-py pools get ``max_connections`` above their concurrency (in the URL): the default,
  100, is fewer than the runs each holds.
- ``durable, 2 workers x 500, one start() per run`` (one round): the same, the runs
  started one after the other with ``Client.start`` (a round trip or more each).
- ``durable, 1 worker x 1000``: the same with one process holding every run.
- ``durable, 2 workers x 500, backlog``: every run started while the workers are stopped
  (SIGSTOP); the clock starts when they continue: the workers alone, without the client.
- ``... backlog, default pool + reconciler`` (one round): as shipped, redis-py's default
  pool; a reconciler brings back the runs the workers drop when the pool runs dry.
- ``asyncio.gather``: ``RUNS`` coroutines of ``STEPS`` ``asyncio.sleep(SLEEP_S)``, in this
  process: the ceiling (no durability, no I/O but the timer).
- ``DBOS`` (one round): ``dbos`` (PyPI) in a process of its own (``bench.dbosrun``)
  against a throwaway local PostgreSQL (``bench.pg``): ``RUNS`` workflows of ``STEPS``
  ``@DBOS.step`` sleeps, started at once with ``DBOS.start_workflow`` (threads) and,
  separately, as ``async`` workflows with ``DBOS.start_workflow_async``; plus PostgreSQL
  commits per step (``pg_stat_database.xact_commit``). When ``dbos`` or PostgreSQL cannot
  be had the row says why instead (``bench.dbosrows``).

Also reported: CPU seconds of the workers, Redis, this process and the rest of the
machine during each batch (other processes compete for the 2 cores), and for a backlog
the CPU seconds Redis and this process spent on the starts, before the clock. The worker logs are
kept in ``<out>/iobound-logs/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import psutil
import redis

from bench import dbosrows, rtcount
from bench.common import AGENTS, fresh, median, ms_of, percentile, settings_for
from bench.sampling import (
    PeakSampler,
    cpu_s,
    machine_busy_s,
    own_cpu_s,
    redis_cpu_s,
    rss_mb,
)
from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.testing import Reconciler, Worker

RUNS = 1000
STEPS = 3
SLEEP_S = 0.5
ROOT = Path(__file__).resolve().parent.parent

CPUS = psutil.cpu_count() or 1


@dataclass(frozen=True)
class Config:
    """A way to run the batch through this system."""

    name: str
    workers: int  # worker processes
    concurrency: int  # DURABLE_CONCURRENCY of each
    #: ``max_connections`` of the workers' redis-py pools (in the URL); None: redis-py's
    #: default (100 in redis-py 6+), fewer than the runs a worker holds here.
    pool: int | None = None
    reconciler: bool = False  # a reconciler process too (recovers runs left behind)
    backlog: bool = False  # runs started while the workers are stopped; timed from SIGCONT
    rounds: int | None = None  # rounds of its own (None: every round)
    #: Runs started with one ``Client.start_many`` (False: one ``Client.start`` per run).
    batch: bool = True
    #: The agent run, and the modules the workers load (``bench.styles``' agent styles).
    agent: str = "count"
    agents: str = AGENTS
    #: More environment of the workers (``DURABLE_USER_THREADS``...).
    env: tuple[tuple[str, str], ...] = ()
    #: More hooks of the workers (``durable worker --hook``: ``bench.scriptcost``'s).
    hooks: tuple[str, ...] = ()


DURABLE = (
    Config("durable, 2 workers x 500", 2, 500, pool=600),
    Config("durable, 2 workers x 500, one start() per run", 2, 500, pool=600, batch=False,
           rounds=1),
    Config("durable, 1 worker x 1000", 1, 1000, pool=1100),
    Config("durable, 2 workers x 500, backlog", 2, 500, pool=600, backlog=True),
    # As shipped: redis-py's default pool (100 connections) for 500 held runs. Started as a
    # backlog so that every slot fills at once; a reconciler recovers what the workers drop.
    Config("durable, 2 workers x 500, backlog, default pool + reconciler", 2, 500,
           reconciler=True, backlog=True, rounds=1),
)
GATHER = "asyncio.gather (ceiling)"


class RunDetails(TypedDict):
    """What the runs' logs say of a batch (``_run_details``): per run, ms."""

    latency: list[float]  # from its start to its last write
    wait: list[float]  # from its start to the first worker write
    states: dict[str, int]  # runs per projected state
    takers: dict[str, int]  # runs per worker (the pid in the first worker write's actor)
    first_start_ms: float | None
    last_write_ms: float | None


#: CPU seconds of a batch, per process (``workers``: one each) and the machine's.
CpuSeconds = TypedDict("CpuSeconds", {
    "workers": list[float], "redis": float, "bench process": float, "reconciler": float,
    "machine": float, "available": float, "other processes": NotRequired[float],
    "redis start": NotRequired[float], "producer start": NotRequired[float]})

#: Worker log lines worth a look: anything at WARNING or above, and tracebacks.
PROBLEM = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback")


def _wait_ready(workers: list[Worker], timeout: float = 60.0) -> None:
    """Until every worker logged its start line (it serves from then on)."""
    end = time.monotonic() + timeout
    pending = list(workers)
    while pending and time.monotonic() < end:
        for w in list(pending):
            if not w.alive():
                raise RuntimeError(f"worker {w.pid} exited at start: see {w.log_path}")
            assert w.log_path is not None
            with contextlib.suppress(OSError):
                if "run slots" in w.log_path.read_text(errors="replace"):
                    pending.remove(w)
        time.sleep(0.05)
    if pending:
        raise RuntimeError(f"workers not ready after {timeout:.0f} s")


def _run_details(r: redis.Redis, ids: list[str], since_ms: float = 0) -> RunDetails:
    """Per run, from its log: started, the first worker write, the last write, the taker.
    Latency and wait count from ``since_ms`` for runs started before it (a backlog)."""
    pipe = r.pipeline(transaction=False)
    for rid in ids:
        pipe.xrange(keys.UNSHARDED.log(rid), "-", "+", count=2)
        pipe.hmget(keys.UNSHARDED.run(rid), "last", "state")
    out = pipe.execute()
    latency: list[float] = []
    wait: list[float] = []
    states: Counter[str] = Counter()
    takers: Counter[str] = Counter()
    first_start: float | None = None
    last_write: float | None = None
    for i in range(0, len(out), 2):
        entries, (last_id, state) = out[i], out[i + 1]
        states[(state or b"?").decode()] += 1
        if not entries:
            continue
        t_start = max(ms_of(entries[0][0]), since_ms)
        first_start = t_start if first_start is None else min(first_start, t_start)
        if len(entries) >= 2:
            wait.append(ms_of(entries[1][0]) - t_start)
            with contextlib.suppress(Exception):
                actor = ev.decode(entries[1][1][b"e"]).actor
                takers[actor.split(":")[1] if actor.count(":") >= 2 else actor] += 1
        if last_id:
            t_last = ms_of(last_id)
            last_write = t_last if last_write is None else max(last_write, t_last)
            latency.append(t_last - t_start)
    return {"latency": latency, "wait": wait, "states": dict(states), "takers": dict(takers),
            "first_start_ms": first_start, "last_write_ms": last_write}


def _dist(xs: list[float]) -> dict[str, float]:
    return {"p50": percentile(xs, 50), "p99": percentile(xs, 99), "max": max(xs or [0.0]),
            "n": len(xs)}


def _log_problems(paths: list[Path]) -> dict[str, Any]:
    lines: list[str] = []
    for p in paths:
        with contextlib.suppress(OSError):
            lines += [f"{p.name}: {ln.strip()}" for ln in p.read_text(errors="replace")
                      .splitlines() if PROBLEM.search(ln)]
    kinds = Counter(re.sub(r"\d+", "N", ln.split(": ", 1)[1])[:140] for ln in lines)
    return {"count": len(lines), "kinds": dict(kinds.most_common(8)), "first": lines[:5]}


def _start(client: Client, ids: list[str], batch: bool, agent: str = "count") -> None:
    """Start the runs: in one ``start_many`` call, or one ``start`` call each."""
    given = {"steps": STEPS, "sleep_s": SLEEP_S}
    if batch:
        client.start_many(agent, [given] * len(ids), run_ids=ids)
        return
    for rid in ids:
        client.start(agent, given, run_id=rid)


def durable(url: str, r: redis.Redis, cfg: Config, runs: int, log_dir: Path,
            tag: str) -> dict[str, Any]:
    """One batch of ``runs`` through ``cfg.workers`` fresh worker processes (see the module
    docstring); with ``cfg.backlog`` the runs are all started while the workers are
    stopped (SIGSTOP) and the clock starts when they continue (SIGCONT)."""
    fresh(r)
    client = Client(settings_for(url, agents=cfg.agents), r)
    logs = [log_dir / f"{tag}-w{i}.log" for i in range(cfg.workers)]
    counts = [log_dir / f"{tag}-w{i}.rt" for i in range(cfg.workers)]
    for p in logs + counts:
        p.unlink(missing_ok=True)
    wurl = f"{url}?max_connections={cfg.pool}" if cfg.pool else url
    workers = [Worker(wurl, log_path=logs[i],
                      hooks=[f"bench.rtcount:Counter={counts[i]}", *cfg.hooks],
                      DURABLE_CONCURRENCY=str(cfg.concurrency), DURABLE_AGENTS=cfg.agents,
                      PYTHONPATH=str(ROOT), env=dict(cfg.env))
               for i in range(cfg.workers)]
    rec = None
    if cfg.reconciler:
        logs.append(log_dir / f"{tag}-reconciler.log")
        logs[-1].unlink(missing_ok=True)
        rec = Reconciler(url, interval=0.5, log_path=logs[-1], DURABLE_AGENTS=AGENTS,
                         PYTHONPATH=str(ROOT))
    out: dict[str, Any] = {"workers": cfg.workers, "concurrency": cfg.concurrency,
                           "max_connections": cfg.pool or "redis-py default",
                           "reconciler": cfg.reconciler, "backlog": cfg.backlog}
    ids = [f"io{tag}-{i}" for i in range(runs)]
    done_key = keys.UNSHARDED.runs_in_state("completed")
    try:
        _wait_ready(workers)
        time.sleep(0.5)  # RQ's loop is up; start-up allocations are done
        rss_idle = [rss_mb(w.pid) for w in workers]
        stats0 = {k.decode(): int(v) for k, v in r.hgetall(keys.STATS).items()}
        if cfg.backlog:
            for w in workers:
                w.send(signal.SIGSTOP)
            start_cpu0 = (redis_cpu_s(r), own_cpu_s())
            with rtcount.counting():
                client_rt0 = rtcount.sent()
                t0 = time.perf_counter()
                _start(client, ids, cfg.batch, cfg.agent)
                start_s = time.perf_counter() - t0
                client_rt = rtcount.sent() - client_rt0
            start_cpu = (redis_cpu_s(r) - start_cpu0[0], own_cpu_s() - start_cpu0[1])
        cmds0 = int(r.info("stats")["total_commands_processed"])
        rt0 = [rtcount.read(p) for p in counts]
        cpu0 = ([cpu_s(w.pid) for w in workers], redis_cpu_s(r), own_cpu_s(),
                machine_busy_s(), cpu_s(rec.pid) if rec else 0.0)
        timeout = 60 + runs * STEPS * SLEEP_S / max(1, cfg.concurrency)
        with PeakSampler([w.pid for w in workers]) as mem:
            srv0 = r.time()
            t0 = time.perf_counter()
            if cfg.backlog:
                for w in workers:
                    w.send(signal.SIGCONT)
            else:
                with rtcount.counting():
                    client_rt0 = rtcount.sent()
                    _start(client, ids, cfg.batch, cfg.agent)
                    start_s = time.perf_counter() - t0
                    client_rt = rtcount.sent() - client_rt0
            end = time.monotonic() + timeout
            while r.zcard(done_key) < runs and time.monotonic() < end:
                time.sleep(0.01)
            poll_wall = time.perf_counter() - t0
        cpu1 = ([cpu_s(w.pid) for w in workers], redis_cpu_s(r), own_cpu_s(),
                machine_busy_s(), cpu_s(rec.pid) if rec else 0.0)
        rt1 = [rtcount.read(p) for p in counts]
        cmds1 = int(r.info("stats")["total_commands_processed"])
        stats1 = {k.decode(): int(v) for k, v in r.hgetall(keys.STATS).items()}
        rss_after = [rss_mb(w.pid) for w in workers]
        det = _run_details(r, ids, since_ms=srv0[0] * 1000 + srv0[1] / 1000)
    finally:
        for w in workers:
            w.send(signal.SIGCONT)
            w.stop(timeout=30)
        if rec is not None:
            rec.stop()
    done = det["states"].get("completed", 0)
    srv_t0_ms = srv0[0] * 1000 + srv0[1] / 1000
    wall = ((det["last_write_ms"] or 0) - srv_t0_ms) / 1000
    steps = done * STEPS
    cpu: CpuSeconds = {"workers": [b - a for a, b in zip(cpu0[0], cpu1[0], strict=True)],
                       "redis": cpu1[1] - cpu0[1], "bench process": cpu1[2] - cpu0[2],
                       "reconciler": cpu1[4] - cpu0[4], "machine": cpu1[3] - cpu0[3],
                       "available": poll_wall * CPUS}
    if cfg.backlog:  # the starts, before the clock: Redis's and this process's CPU
        cpu["redis start"], cpu["producer start"] = start_cpu
    cpu["other processes"] = max(0.0, cpu["machine"] - sum(cpu["workers"]) - cpu["redis"]
                                 - cpu["bench process"] - cpu["reconciler"])
    worker_rt = sum(b.get("round_trips", 0) - a.get("round_trips", 0)
                    for a, b in zip(rt0, rt1, strict=True))
    out.update({
        "runs": runs, "completed": done, "states": det["states"],
        "wall_s": wall, "ratio_to_ideal": wall / (STEPS * SLEEP_S),
        "poll_wall_s": poll_wall, "start_s": start_s,
        "latency_ms": _dist(det["latency"]), "wait_ms": _dist(det["wait"]),
        "runs_per_worker": sorted(det["takers"].values(), reverse=True),
        "rss_idle_mb": rss_idle, "rss_peak_mb": mem.rss, "rss_after_mb": rss_after,
        "threads_peak": mem.threads,
        "cpu_s": cpu,
        "worker_round_trips_per_step": worker_rt / steps if steps else float("nan"),
        "client_round_trips_per_run": client_rt / runs,
        "server_commands_per_step": (cmds1 - cmds0) / steps if steps else float("nan"),
        "stats_delta": {k: v - stats0.get(k, 0) for k, v in stats1.items()
                        if v != stats0.get(k, 0)},
        "logs": [str(p) for p in logs],
    })
    out["log_problems"] = _log_problems(logs)
    if done != runs:
        out["incomplete"] = f"{done}/{runs} completed: {det['states']}"
    return out


async def _gather(runs: int) -> None:
    async def one() -> None:
        for _ in range(STEPS):
            await asyncio.sleep(SLEEP_S)

    await asyncio.gather(*(one() for _ in range(runs)))


def gather(runs: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    asyncio.run(_gather(runs))
    wall = time.perf_counter() - t0
    return {"runs": runs, "wall_s": wall, "ratio_to_ideal": wall / (STEPS * SLEEP_S)}


def run(servers: Any, quick: bool = False, rounds: int | None = None,
        out_dir: Path | None = None, log: Any = print) -> dict[str, Any]:
    runs = 200 if quick else RUNS
    rounds = rounds or (1 if quick else 2)
    log_dir = (out_dir or ROOT / "bench" / "results") / "iobound-logs"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    srv = servers.get("everysec")
    configs: list[Config | None] = [*DURABLE, None]  # None: asyncio.gather
    samples: dict[str, list[dict[str, Any]]] = {
        (c.name if c else GATHER): [] for c in configs}
    for rnd in range(rounds):
        order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
        for cfg in order:
            if cfg is None:
                name, res = GATHER, gather(runs)
            else:
                if cfg.rounds is not None and rnd >= cfg.rounds:
                    continue
                name = cfg.name
                r = srv.client()
                try:
                    res = durable(srv.url, r, cfg, runs, log_dir,
                                  tag=f"{cfg.workers}x{cfg.concurrency}"
                                      f"{'-backlog' if cfg.backlog else ''}"
                                      f"{'-onebyone' if not cfg.batch else ''}"
                                      f"{'-defaultpool' if not cfg.pool else ''}-r{rnd + 1}")
                finally:
                    r.close()
            samples[name].append(res)
            extra = ""
            if "rss_peak_mb" in res:
                extra = (f", peak RSS {'/'.join(f'{x:.0f}' for x in res['rss_peak_mb'])} MB, "
                         f"{res['worker_round_trips_per_step']:.2f} round trips/step, "
                         f"starts {res['start_s']:.2f} s, "
                         f"{res['log_problems']['count']} log problems")
            log(f"  iobound round {rnd + 1}/{rounds} {name:52s} wall {res['wall_s']:6.2f} s "
                f"({res['ratio_to_ideal']:.2f}x ideal){extra}")
            if "incomplete" in res:
                log(f"  WARNING: {name}: {res['incomplete']}")
    out: dict[str, Any] = {"runs": runs, "steps": STEPS, "sleep_s": SLEEP_S,
                           "ideal_s": STEPS * SLEEP_S, "rounds": rounds, "configs": {}}
    for name, ss in samples.items():
        if not ss:
            continue
        row = dict(sorted(ss, key=lambda s: s["wall_s"])[len(ss) // 2])  # the median round
        row["wall_s"] = median([s["wall_s"] for s in ss])
        row["ratio_to_ideal"] = row["wall_s"] / (STEPS * SLEEP_S)
        row["all"] = [round(s["wall_s"], 3) for s in ss]
        if "rss_peak_mb" in row:
            row["rss_peak_mb_max"] = max(max(s["rss_peak_mb"]) for s in ss)
            for k in ("worker_round_trips_per_step", "server_commands_per_step", "start_s",
                      "client_round_trips_per_run"):
                row[k] = median([s[k] for s in ss])
            row["log_problems_total"] = sum(s["log_problems"]["count"] for s in ss)
            row["incomplete_rounds"] = [s["incomplete"] for s in ss if "incomplete" in s]
        out["configs"][name] = row
    out["configs"].update(dbosrows.dbos(runs, 1, log, steps=STEPS, sleep_s=SLEEP_S))
    return out
