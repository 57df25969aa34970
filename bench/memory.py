"""Item 5: Redis memory per step and worker RSS.

Real runs through a real worker process: 4-step and 1000-step ``count`` runs. Per run,
``MEMORY USAGE`` (SAMPLES 0: every element) of ``dx:{R}:log`` + ``dx:{R}:run`` +
``dx:{R}:fx``, divided by its steps. Also reported: what each run leaves in global keys
(indexes by update time and state, the due set) and its ``fence`` key, the spacing of
checkpoint events in a long run's log, and the worker's RSS (psutil) after each batch.

Conversations (``bench/chat.py``): code-agent runs of 100 calls with 5 KB replies and 300
calls with 2 KB replies (each call given the whole conversation): their Redis bytes (log +
projection + ledger) against the bytes of their messages (target ≤ 1.2x).
"""

from __future__ import annotations

import time
from typing import Any

import psutil
import redis

from bench.chat import message_bytes
from bench.common import AGENTS, fresh, median, settings_for, worker
from durable.client import Client
from durable.log import events as ev
from durable.log import keys


def wait_done(r: redis.Redis, ids: list[str], timeout: float = 300.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pipe = r.pipeline(transaction=False)
        for rid in ids:
            pipe.hget(keys.UNSHARDED.run(rid), "state")
        states = pipe.execute()
        if all(s == b"completed" for s in states):
            return
        time.sleep(0.05)
    raise TimeoutError("runs did not complete")


def per_run_bytes(r: redis.Redis, rid: str) -> dict[str, int]:
    return {name: int(r.memory_usage(fn(rid), samples=0) or 0)
            for name, fn in (("log", keys.UNSHARDED.log), ("run", keys.UNSHARDED.run),
                             ("fx", keys.UNSHARDED.ledger),
                             ("fence", keys.UNSHARDED.fence))}


def checkpoint_spacing(r: redis.Redis, rid: str) -> dict[str, int]:
    seqs = [ev.decode(f[b"e"]).seq for _i, f in r.xrange(keys.UNSHARDED.log(rid))
            if ev.decode(f[b"e"]).__class__ is ev.Checkpoint]
    total = r.xlen(keys.UNSHARDED.log(rid))
    gaps = [b - a for a, b in zip([0, *seqs], [*seqs, total], strict=True)]
    return {"checkpoints": len(seqs), "max_events_between": max(gaps), "events": total}


#: The agents of this item: the bench agents and the conversation (``bench/chat.py``).
MEMORY_AGENTS = f"{AGENTS},bench.chat"

#: Conversations measured: (calls, reply bytes).
CONVERSATIONS = ((100, 5000), (300, 2000))


def conversations(r: redis.Redis, client: Client, quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for turns, size in CONVERSATIONS[:1] if quick else CONVERSATIONS:
        rid = f"chat-{turns}x{size}"
        client.start("bench_chat", {"turns": turns, "text_bytes": size}, run_id=rid)
        wait_done(r, [rid])
        parts = per_run_bytes(r, rid)
        stored = parts["log"] + parts["run"] + parts["fx"]
        messages = message_bytes(turns, size)
        out[f"{turns} calls x {size // 1000} KB"] = {
            "bytes": parts, "message_bytes": messages, "run_bytes": stored,
            "ratio": stored / messages, "log_entries": r.xlen(keys.UNSHARDED.log(rid))}
    return out


def run(servers: Any, quick: bool = False, log: Any = print) -> dict[str, Any]:
    short_runs = 50 if quick else 150
    long_runs, long_steps = (1, 1000) if quick else (2, 1000)
    srv = servers.get("everysec")
    r = srv.client()
    fresh(r)
    client = Client(settings_for(srv.url, agents=MEMORY_AGENTS), r)
    wproc = worker(srv.url, DURABLE_AGENTS=MEMORY_AGENTS)
    proc = psutil.Process(wproc.pid)
    rss: list[dict[str, float]] = []
    out: dict[str, Any] = {}
    try:
        for batch in range(2):
            short = [f"m{batch}s{i}" for i in range(short_runs)]
            # Long runs in the first batch only; the second one shows RSS growth.
            long = [f"m{batch}l{i}" for i in range(long_runs if batch == 0 else 0)]
            for rid in long:
                client.start("count", {"steps": long_steps}, run_id=rid)
            for rid in short:
                client.start("count", {"steps": 4}, run_id=rid)
            wait_done(r, short + long)
            time.sleep(0.2)
            rss.append({"after_runs": (batch + 1) * short_runs + long_runs,
                        "rss_mb": proc.memory_info().rss / 2**20})
            if batch == 0:
                for label, ids, steps in (("4-step", short, 4), (f"{long_steps}-step", long,
                                                                   long_steps)):
                    per = [per_run_bytes(r, rid) for rid in ids]
                    parts = {k: median([p[k] for p in per]) for k in per[0]}
                    durable_bytes = parts["log"] + parts["run"] + parts["fx"]
                    xlen = median([r.xlen(keys.UNSHARDED.log(rid)) for rid in ids])
                    out[label] = {"runs": len(ids), "steps": steps, "bytes": parts,
                                  "log_entries": xlen,
                                  "bytes_per_step": durable_bytes / steps,
                                  "log_bytes_per_entry": parts["log"] / xlen}
                out["checkpoints (1000-step run)"] = checkpoint_spacing(r, long[0])
                n_runs = short_runs + long_runs
                glob = {k: int(r.memory_usage(k, samples=0) or 0) for k in
                        (keys.RUNS_BY_UPDATE, keys.UNSHARDED.runs_in_state("completed"), keys.DUE)}
                out["global bytes per run"] = {k: v / n_runs for k, v in glob.items()}
        out["conversations"] = conversations(r, client, quick)
        out["worker_rss"] = rss
        out["worker_rss_growth_mb"] = rss[-1]["rss_mb"] - rss[0]["rss_mb"]
        out["used_memory_mb"] = r.info("memory")["used_memory"] / 2**20
        return out
    finally:
        wproc.stop()
        r.close()
