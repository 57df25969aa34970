"""Item 9: scaling out -- the log on a Redis Cluster (3 masters, 3 replicas, loopback).

Side by side, in interleaved rounds, on the same cluster (flushed between batches):

- ``1 shard``: ``DURABLE_SHARDS=1``: every run's keys and indexes in one slot, so one
  master does all the log's work (what one server gives, plus the cluster client).
- ``3 shards``: ``DURABLE_SHARDS=3``: the shards' tags fall one in each third of the slot
  space, one shard per master.
- ``3 shards, MIN_REPLICAS=1``: the same, each append acknowledged only after ``WAIT 1``
  (the hub: one ``WAIT`` per pipeline to a master, covering every append in it).
- ``3 shards, threads``: ``DURABLE_DRIVER=threads``, a thread per run and a call each (what
  every worker did on a cluster before the hub ran there), for reference.
- ``one server``: the unsharded layout on one plain server (the embedded default): what
  the cluster is compared with.

Every configuration but ``threads`` runs the worker's default driver, the hub (its start
line says so). The ratios: ``3 shards / one server`` (target >= 0.8: spreading the log
over masters must not cost a fifth of the throughput when all of them share this
machine's cores -- one shard per master, as many masters as the machine has cores or
more), and ``MIN_REPLICAS=1 / 3 shards`` (target >= 0.8: a replica acknowledgement costs at
most 20 %).

Each batch: K four-step ``count`` runs started in this process, then W ``durable worker
--burst`` processes; steps/s from the runs' logs (first worker write to last write), as
the throughput item measures. Also: bytes per run (``MEMORY USAGE`` of a completed run's
log, projection and ledger, and its share of the shard's indexes), and the latency one
append adds with ``MIN_REPLICAS=1`` (sequential appends from one thread, so the figure is
the round trip each step waits, not a throughput).

On a 2-core machine the masters, replicas, workers and this process share two CPUs: the
ratio of 3 shards to 1 shows what spreading the log's work costs or saves when CPU, not
the number of Redis processes, is the limit; on separate machines each master has its own.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

import redis

from bench import capacity
from bench.common import AGENTS, median, run_window, settings_for, worker
from durable.backend.cluster import LocalCluster
from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.log.store import EventLog, Spec
from durable.testing import Server, wait_for

STEPS = 4
CONFIGS = ("one server", "1 shard", "3 shards", "3 shards, MIN_REPLICAS=1",
           "3 shards, threads")


def _env(cfg: str, cluster: LocalCluster, queue: Server, server: Server) -> dict[str, str]:
    if cfg == "one server":
        return {"DURABLE_REDIS_URL": server.url, "DURABLE_SHARDS": "0",
                "DURABLE_MIN_REPLICAS": "0"}
    return {"DURABLE_REDIS_URL": cluster.url, "DURABLE_REDIS_CLUSTER": "1",
            "DURABLE_QUEUE_URL": queue.url, "DURABLE_SHARDS": "1" if cfg == "1 shard" else "3",
            "DURABLE_MIN_REPLICAS": "1" if "MIN_REPLICAS" in cfg else "0",
            "DURABLE_DRIVER": "threads" if "threads" in cfg else "hub"}


def _flush(cluster: LocalCluster, queue: Server, server: Server) -> None:
    for url in [*cluster.urls(), queue.url, server.url]:
        with redis.Redis.from_url(url) as r:
            if r.info("replication")["role"] == "master":
                r.flushall()


def _use(env: dict[str, str]) -> None:
    """This process's environment (inherited by the workers) is exactly ``env``'s DURABLE_*."""
    for k in [k for k in os.environ if k.startswith("DURABLE_")]:
        del os.environ[k]
    os.environ.update(env)


def _masters(cluster: LocalCluster) -> list[str]:
    out = []
    for url in cluster.urls():
        with redis.Redis.from_url(url) as r:
            if r.info("replication")["role"] == "master":
                out.append(url)
    return out


def batch(cfg: str, env: dict[str, str], runs: int, workers: int,
          log_servers: list[str]) -> dict[str, Any]:
    """One batch; ``log_servers``: the servers holding the log (each master, or the one
    server), whose CPU per step the capacity model reads."""
    _use(env)
    settings = settings_for(env["DURABLE_REDIS_URL"])
    client = Client(settings)
    cpu_before = capacity.cpu_seconds(log_servers)
    try:
        ids = [f"c{i}" for i in range(runs)]
        for rid in ids:
            client.start("count", {"steps": STEPS, "sleep_s": 0.0}, run_id=rid)
        t0 = time.perf_counter()
        procs = [worker(env["DURABLE_REDIS_URL"], burst=True, DURABLE_AGENTS=AGENTS, **env)
                 for _ in range(workers)]
        for p in procs:
            try:
                p.wait(300)
            except subprocess.TimeoutExpired:
                p.kill()
        wall = time.perf_counter() - t0
        first, last, done = run_window(client.redis, ids, client.log.keys)
        window = max(last - first, 1) / 1000
        cpu = capacity.per_step(cpu_before, capacity.cpu_seconds(log_servers), done * STEPS)
        out: dict[str, Any] = {"steps_per_s": done * STEPS / window, "completed": done,
                               "runs": runs, "wall_s": wall,
                               "redis_cpu_us_per_step": [cpu[u] for u in log_servers]}
        if cfg in ("one server", "1 shard", "3 shards"):
            out["bytes_per_run"] = _bytes_per_run(client.redis, client.log.keys,
                                                  ids[: min(50, runs)])
        return out
    finally:
        client.close()


def _bytes_per_run(r: Any, layout: keys.KeyLayout, ids: list[str]) -> dict[str, float]:
    per: dict[str, list[int]] = {"log": [], "run": [], "fx": []}
    for rid in ids:
        per["log"].append(int(r.memory_usage(layout.log(rid), samples=0) or 0))
        per["run"].append(int(r.memory_usage(layout.run(rid), samples=0) or 0))
        per["fx"].append(int(r.memory_usage(layout.ledger(rid), samples=0) or 0))
    index = 0
    members = 0
    for shard in layout.shard_ids():
        for key in (layout.runs_index(shard), layout.runs_in_state("completed", shard)):
            index += int(r.memory_usage(key, samples=0) or 0)
            members += 0 if key != layout.runs_index(shard) else int(r.zcard(key))
    out = {k: median(v) for k, v in per.items()}
    out["indexes"] = index / max(members, 1)
    out["total"] = sum(out.values())
    return out


def append_latency(env: dict[str, str], n: int) -> dict[str, float]:
    """Median and p95 time (ms) of one ``append.lua`` call, sequential, one thread."""
    _use(env)
    settings = settings_for(env["DURABLE_REDIS_URL"])
    client = Client(settings)
    try:
        elog = EventLog.from_settings(client.redis, settings)
        client.start("count", {"steps": 1, "sleep_s": 0.0}, run_id="lat", enqueue=False)
        handle = elog.load("lat", actor="bench")
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            elog.commit(handle, [Spec(ev.LeaseAcquired, {"owner": "bench", "epoch": i + 1})])
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        return {"median_ms": median(times), "p95_ms": times[int(0.95 * (len(times) - 1))],
                "appends": n}
    finally:
        client.close()


def run(servers: Any = None, quick: bool = False, rounds: int | None = None,
        runs: int | None = None, log: Any = print) -> dict[str, Any]:
    rounds = rounds or (1 if quick else 3)
    runs = runs or (60 if quick else 200)
    workers = 2
    saved = {k: v for k, v in os.environ.items() if k.startswith("DURABLE_")}
    samples: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    latency: dict[str, dict[str, float]] = {}
    with LocalCluster(3, 1, node_timeout_ms=5000) as cluster, Server(fsync="everysec") as queue, \
            Server(fsync="everysec") as server:
        wait_for(lambda: all(_has_replica(n.port) for n in cluster.nodes[:3]), 60, 0.1)
        masters = _masters(cluster)
        try:
            for rnd in range(rounds):
                order = list(CONFIGS[rnd % len(CONFIGS):] + CONFIGS[:rnd % len(CONFIGS)])
                for cfg in order:
                    _flush(cluster, queue, server)
                    res = batch(cfg, _env(cfg, cluster, queue, server), runs, workers,
                                [server.url] if cfg == "one server" else masters)
                    samples[cfg].append(res)
                    log(f"  cluster round {rnd + 1}/{rounds} {cfg:26s} "
                        f"{res['steps_per_s']:8.0f} steps/s ({res['completed']}/{runs} runs)")
            for cfg in ("3 shards", "3 shards, MIN_REPLICAS=1"):
                _flush(cluster, queue, server)
                latency[cfg] = append_latency(_env(cfg, cluster, queue, server),
                                              100 if quick else 500)
                log(f"  append latency {cfg:26s} {latency[cfg]['median_ms']:.3f} ms")
        finally:
            _use(saved)
    rows: dict[str, Any] = {}
    for cfg in CONFIGS:
        ss = samples[cfg]
        rows[cfg] = {"steps_per_s": median([s["steps_per_s"] for s in ss]),
                     "all": [round(s["steps_per_s"], 1) for s in ss],
                     "incomplete": [s for s in ss if s["completed"] != s["runs"]]}
        cpus = [s["redis_cpu_us_per_step"] for s in ss]
        rows[cfg]["redis_cpu_us_per_step"] = [median([c[i] for c in cpus])
                                              for i in range(len(cpus[0]))]
        sizes = [s["bytes_per_run"] for s in ss if "bytes_per_run" in s]
        if sizes:
            rows[cfg]["bytes_per_run"] = {k: median([b[k] for b in sizes]) for k in sizes[0]}
    one, three = rows["1 shard"]["steps_per_s"], rows["3 shards"]["steps_per_s"]
    wait = rows["3 shards, MIN_REPLICAS=1"]["steps_per_s"]
    single, threads = rows["one server"]["steps_per_s"], rows["3 shards, threads"]["steps_per_s"]
    return {
        "runs_per_batch": runs, "steps_per_run": STEPS, "rounds": rounds, "workers": workers,
        "cpus": os.cpu_count(), "rows": rows, "append_latency": latency,
        "ratios": {"3 shards / one server": three / single,
                   "3 shards / 1 shard": three / one,
                   "MIN_REPLICAS=1 / 3 shards": wait / three,
                   "3 shards: hub / threads": three / threads},
        # The same ratios round by round (each round runs every configuration within
        # seconds of the others), their median: steadier than a ratio of medians when the
        # machine's load swings between rounds.
        "paired_ratios": {
            "3 shards / one server": _paired(samples, "3 shards", "one server"),
            "MIN_REPLICAS=1 / 3 shards": _paired(samples, "3 shards, MIN_REPLICAS=1",
                                                 "3 shards"),
            "3 shards: hub / threads": _paired(samples, "3 shards", "3 shards, threads"),
        },
        "min_replicas_ms_per_append": latency["3 shards, MIN_REPLICAS=1"]["median_ms"]
        - latency["3 shards"]["median_ms"],
        "capacity": capacity.model(rows["one server"]["redis_cpu_us_per_step"][0],
                                   rows["3 shards"]["redis_cpu_us_per_step"]),
    }


def _paired(samples: dict[str, list[dict[str, Any]]], top: str, bottom: str) -> float:
    """The median over rounds of ``top``'s steps/s over ``bottom``'s in the same round."""
    return median([a["steps_per_s"] / b["steps_per_s"]
                   for a, b in zip(samples[top], samples[bottom], strict=True)])


def _has_replica(port: int) -> bool:
    with redis.Redis(port=port) as r:
        return int(r.info("replication").get("connected_slaves", 0)) >= 1


def report(cl: dict[str, Any]) -> list[str]:
    """Markdown lines of this item's results (``bench.report``)."""
    out = [f"## Scaling out: the log on a Redis Cluster (3 masters + 3 replicas on loopback, "
           f"{cl['runs_per_batch']} four-step runs per batch, {cl['workers']} workers, "
           f"{cl['rounds']} interleaved rounds, {cl['cpus']} CPUs shared by every process)\n",
           "| configuration | steps/s (median) | all rounds | bytes per run | "
           "Redis CPU µs per step, each log server |",
           "|---|---:|---|---:|---|"]
    for name, row in cl["rows"].items():
        size = row.get("bytes_per_run", {}).get("total")
        cpu = ", ".join(f"{x:.0f}" for x in row.get("redis_cpu_us_per_step", []))
        out.append(f"| {name} | {row['steps_per_s']:.0f} | {row['all']} | "
                   f"{'' if size is None else f'{size:.0f}'} | {cpu} |")
    ratios = ", ".join(f"{k}: {v:.2f}" for k, v in cl["ratios"].items())
    if cl.get("paired_ratios"):
        ratios += "; round by round (median of each round's ratio): " + ", ".join(
            f"{k}: {v:.2f}" for k, v in cl["paired_ratios"].items())
    lat = cl["append_latency"]
    out.append(f"\nRatios: {ratios}. One append, sequential: "
               + "; ".join(f"{k} {v['median_ms']:.3f} ms (p95 {v['p95_ms']:.3f})"
                           for k, v in lat.items())
               + f": MIN_REPLICAS=1 adds {cl['min_replicas_ms_per_append']:.3f} ms per "
               "append (WAIT's round trip to a replica).\n")
    out += capacity.report(cl.get("capacity", {}))
    return out
