"""What sealing costs a running run (``durable.log.sealer``): a worker's CPU per no-op step,
Redis's CPU per step and the Redis bytes per step, with no seal key, with one (a run
sealed when it ends, and by its lease holder every ``DURABLE_SEAL_EVERY`` entries), and
with a seal every 10 entries.

Real runs through a real worker process: ``count`` runs of no-op steps, in batches, the
configurations interleaved batch by batch on one embedded server. The worker's CPU is its
process's (user + system, psutil) over the batch; Redis's is ``INFO cpu``'s; the bytes are
``MEMORY USAGE`` (SAMPLES 0) of each run's log, projection, ledger and seal.

    python -m bench.chainseals [--quick]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import redis

from bench.common import AGENTS, fresh, median, settings_for, worker
from bench.memory import wait_done
from durable.client import Client
from durable.log import keys
from durable.security.signing import keygen, load_public_key
from durable.testing import AdminKey, Server

#: The configurations measured: their name and the worker's extra settings (None: no key).
CONFIGS: dict[str, dict[str, str] | None] = {
    "no seal key": None,
    "seal key, every 100 entries": {"DURABLE_SEAL_EVERY": "100"},
    "seal key, every 10 entries": {"DURABLE_SEAL_EVERY": "10"},
}


def _cpu(proc: psutil.Process) -> float:
    total = proc.cpu_times()
    own = total.user + total.system
    for child in proc.children(recursive=True):
        try:
            t = child.cpu_times()
            own += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return own


def _redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _bytes(r: redis.Redis, run_id: str) -> int:
    layout = keys.UNSHARDED
    return sum(int(r.memory_usage(k, samples=0) or 0) for k in (
        layout.log(run_id), layout.run(run_id), layout.ledger(run_id), layout.seal(run_id))
        if r.exists(k))


def batch(url: str, r: redis.Redis, env: dict[str, str], runs: int, steps: int,
          tag: str, sealer: tuple[AdminKey, bytes]) -> dict[str, float]:
    """One batch of ``runs`` runs of ``steps`` no-op steps through a new worker."""
    fresh(r)
    client = Client(settings_for(url), r)
    admin, public = sealer
    client.approvers.add("bench-sealer", ["sealer"], load_public_key(public),
                         admin_key=admin.private, by="bench")
    ids = [client.start("count", {"steps": steps}, run_id=f"{tag}-{i}", enqueue=False).run_id
           for i in range(runs)]
    w = worker(url, **env)
    try:
        proc = psutil.Process(w.pid)
        time.sleep(1.0)  # started and idle: its start-up is not counted
        cpu0, rcpu0 = _cpu(proc), _redis_cpu(r)
        for run_id in ids:
            client.enqueue(run_id)
        wait_done(r, ids)
        if env.get("DURABLE_SEAL_KEY"):  # the seal follows the terminal append
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(
                    r.exists(keys.UNSHARDED.seal(i)) for i in ids):
                time.sleep(0.05)
        cpu, rcpu = _cpu(proc) - cpu0, _redis_cpu(r) - rcpu0
    finally:
        w.stop()
    total = runs * steps
    return {"worker_us": cpu / total * 1e6, "redis_us": rcpu / total * 1e6,
            "bytes": median([_bytes(r, i) for i in ids[:50]]) / steps}


def _spread(xs: list[float]) -> str:
    return f"{median(xs):.0f} [{min(xs):.0f}-{max(xs):.0f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--quick", action="store_true", help="fewer and smaller batches")
    p.add_argument("--rounds", type=int, default=0)
    p.add_argument("--runs", type=int, default=0, help="runs per batch")
    p.add_argument("--steps", type=int, default=20, help="no-op steps per run")
    args = p.parse_args(argv)
    runs, steps = args.runs or (50 if args.quick else 200), args.steps
    rounds = args.rounds or (2 if args.quick else 3)
    admin = AdminKey.make()
    os.environ["DURABLE_ADMIN_KEYS"] = admin.public
    os.environ.setdefault("DURABLE_AGENTS", AGENTS)
    tmp = Path(tempfile.mkdtemp(prefix="chainseals-"))
    srv = Server(fsync="everysec").start()
    try:
        r = srv.client()
        private, public = keygen()
        key_file = tmp / "sealer.key"
        key_file.write_bytes(private)
        key_file.chmod(0o600)
        found: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGS}
        for rnd in range(rounds):
            for name, extra in CONFIGS.items():
                env: dict[str, Any] = {"DURABLE_ADMIN_KEYS": admin.public}
                if extra is not None:
                    env.update(extra, DURABLE_SEAL_KEY=str(key_file),
                               DURABLE_SEAL_SIGNER="bench-sealer")
                found[name].append(batch(srv.url, r, env, runs, steps, f"r{rnd}",
                                         (admin, public)))
        print(f"{runs} runs x {steps} no-op steps per batch, {rounds} rounds: median "
              "[min-max]")
        print(f"{'configuration':<30} {'worker us/step':>22} {'redis us/step':>22} "
              f"{'bytes/step':>11}")
        for name, rows in found.items():
            cells = [_spread([x[k] for x in rows]) for k in ("worker_us", "redis_us")]
            print(f"{name:<30} {cells[0]:>22} {cells[1]:>22} "
                  f"{median([x['bytes'] for x in rows]):>11.0f}")
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
