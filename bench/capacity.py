"""A capacity model for the log's Redis: CPU per step, steps per core, shards for a load.

Redis runs commands on one thread, so one server (or one master of a cluster) saturates
when the CPU its commands take reaches one core. The cluster item samples every server's
own CPU counters (``INFO cpu``: ``used_cpu_sys`` + ``used_cpu_user``, the server process's
user and system time) before a batch and after it, and divides by the steps the batch took.
From that figure:

- **steps/s per Redis core** = 1 / (CPU seconds per step): the most steps one shard can
  take when its core is its only limit;
- **shards for a load** of L steps/s at utilisation u (headroom, 0.5 by default) =
  ceil(L x CPU per step / u);
- the model is **checked** against the measured cluster: spreading the runs over N
  shards should leave each master about 1/N of one server's CPU per step (the sharded
  layout adds no work per step, only a cluster client), which the report compares with
  what each master actually used.

Replicas' CPU is reported apart: a replica applies the same writes, so it needs a core of
its own as its master does, but adds no capacity for writes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import redis

#: Share of a core a shard is planned to use (the rest absorbs bursts and recoveries).
HEADROOM = 0.5


def cpu_seconds(urls: Iterable[str]) -> dict[str, float]:
    """Each server's own CPU seconds so far (user + system of the server process)."""
    out = {}
    for url in urls:
        with redis.Redis.from_url(url) as r:
            info = r.info("cpu")
            out[url] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return out


def per_step(before: Mapping[str, float], after: Mapping[str, float],
             steps: int) -> dict[str, float]:
    """Microseconds of each server's CPU per step between two ``cpu_seconds`` samples."""
    return {url: (after[url] - before[url]) * 1e6 / max(steps, 1) for url in before}


def shards_for(load_steps_per_s: float, cpu_us_per_step: float,
               headroom: float = HEADROOM) -> int:
    """Shards (masters, one core each) a load needs at ``headroom`` use of each core."""
    return max(1, math.ceil(load_steps_per_s * cpu_us_per_step / 1e6 / headroom))


def model(one_server_us: float, masters_us: list[float]) -> dict[str, Any]:
    """The figures of the model from one server's CPU per step and each master's on the
    sharded cluster, and how far the cluster is from the model's prediction."""
    n = len(masters_us)
    predicted = one_server_us / n if n else 0.0
    worst = max(masters_us) if masters_us else 0.0
    return {
        "one_server_cpu_us_per_step": one_server_us,
        "steps_per_s_per_core": 1e6 / one_server_us if one_server_us else 0.0,
        "masters": n,
        "predicted_cpu_us_per_step_per_master": predicted,
        "measured_cpu_us_per_step_per_master": masters_us,
        "busiest_master_vs_prediction": worst / predicted if predicted else 0.0,
        "cluster_cpu_us_per_step": sum(masters_us),
        "shards_for": {str(load): shards_for(load, max(one_server_us, sum(masters_us)))
                       for load in (1_000, 10_000, 50_000, 100_000)},
    }


def report(cap: Mapping[str, Any]) -> list[str]:
    """Markdown lines of the model (``bench.report``)."""
    if not cap:
        return []
    masters = ", ".join(f"{x:.0f}" for x in cap["measured_cpu_us_per_step_per_master"])
    loads = ", ".join(f"{int(k):,} steps/s: {v}" for k, v in cap["shards_for"].items())
    return [
        "### Capacity model (Redis CPU per step; `bench/capacity.py`)\n",
        f"- One server: **{cap['one_server_cpu_us_per_step']:.0f} µs of Redis CPU per step**"
        f" (starts included), so one Redis core takes at most "
        f"**{cap['steps_per_s_per_core']:,.0f} steps/s**.",
        f"- {cap['masters']} shards: each master used {masters} µs per step of the whole "
        f"cluster's steps; the model predicts "
        f"{cap['predicted_cpu_us_per_step_per_master']:.0f} (one server's / "
        f"{cap['masters']}); the busiest master is at "
        f"{cap['busiest_master_vs_prediction']:.2f}x the prediction. The cluster as a "
        f"whole spent {cap['cluster_cpu_us_per_step']:.0f} µs per step.",
        f"- Shards (one core each, planned at {HEADROOM:.0%} use) for a sustained load: "
        f"{loads}.",
        "",
    ]
