"""Bringing back the runs of a dead worker: the reconciler process when this installation
has one (``durable reconciler``), else a loop that re-enqueues stalled runs.

The loop is the minimum a crash needs: a run that is not terminal, not waiting, whose lease
key (``dx:{R}:lease``) is gone and which has not changed for two lease TTLs (its due time in
``dx:due`` has passed) gets a forced ``advance``. It cannot wake retry timers or expire
waits: that is the reconciler's job, and why the reconciler is preferred.

``repair_lost_jobs`` adds a watch over RQ's dequeue window. RQ moves a job from the queue
to ``rq:queue:<name>:intermediate`` when a worker takes it, and into the started registry
when the worker starts it; a worker SIGKILLed between the two loses the ``advance`` job,
while the run's ``dx:{R}:queued`` marker (60 s) tells the reconciler an advance is still
queued, so the run stalls until the marker expires. The watch re-enqueues the run of a job
left in the intermediate list for two lease TTLs with no lease held, and counts it
(``repaired``): a figure the chaos suite reports, not a silent fix.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

from durable import keys
from durable.commands import ADVANCE, enqueue_advance, make_queue
from durable.harness import env_for

#: States in which a run needs a worker (the ones the loop watches).
ACTIVE = ("pending", "cancel_requested", "outcome_unknown")


def reconciler_available() -> bool:
    """True when the ``durable`` CLI has a ``reconciler`` subcommand."""
    from durable.cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return "reconciler" in action.choices
    return False


def choose_mode() -> str:
    """``reconciler`` or ``loop``; ``DURABLE_RECOVERY=loop`` forces the loop."""
    forced = os.environ.get("DURABLE_RECOVERY", "")
    if forced in ("reconciler", "loop"):
        return forced
    return "reconciler" if reconciler_available() else "loop"


class Recovery:
    def __init__(self, redis_url: str, env: dict[str, str], *, queue: str, lease_ttl_ms: int,
                 interval: float = 0.2, log_path: Path | None = None,
                 mode: str | None = None, repair_lost_jobs: bool = False) -> None:
        self.redis_url, self.env, self.queue = redis_url, env, queue
        self.lease_ttl_ms, self.interval, self.log_path = lease_ttl_ms, interval, log_path
        self.mode = mode or choose_mode()
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.nudged = 0
        self.repair_lost_jobs = repair_lost_jobs
        #: Runs re-enqueued because their ``advance`` job was lost in RQ's dequeue window.
        self.repaired: list[str] = []

    def start(self) -> Recovery:
        if self.mode == "reconciler":
            out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "durable", "reconciler", "--interval",
                     str(self.interval)], env=env_for(self.redis_url, **self.env),
                    stdout=out, stderr=out, start_new_session=True)
            finally:
                if out is not subprocess.DEVNULL:
                    out.close()  # type: ignore[union-attr]
        else:
            self._threads.append(threading.Thread(target=self._loop, daemon=True))
        if self.repair_lost_jobs:
            self._threads.append(threading.Thread(target=self._watch_dequeues, daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for thread in self._threads:
            thread.join(5)

    def _loop(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        queue = make_queue(client, self.queue)
        last: dict[str, float] = {}
        try:
            while not self._stop.wait(self.interval):
                now = time.time()
                for run_id in self.stalled(client, int(now * 1000)):
                    if now - last.get(run_id, 0) < 2 * self.lease_ttl_ms / 1000:
                        continue
                    last[run_id] = now
                    enqueue_advance(client, queue, run_id, force=True)
                    self.nudged += 1
        finally:
            client.close()

    def _watch_dequeues(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        queue = make_queue(client, self.queue)
        first_seen: dict[str, float] = {}
        try:
            while not self._stop.wait(0.25):
                now = time.monotonic()
                ids = set(queue.intermediate_queue.get_job_ids())
                first_seen = {j: first_seen.get(j, now) for j in ids}
                for job_id, seen in first_seen.items():
                    if now - seen < 2 * self.lease_ttl_ms / 1000:
                        continue
                    if job_id in queue.started_job_registry:
                        continue
                    job = queue.fetch_job(job_id)
                    if job is None or job.func_name != ADVANCE or not job.args:
                        continue  # only a lost advance(run) is known to strand its run
                    queue.intermediate_queue.remove(job_id)
                    run_id = str(job.args[0])
                    if not client.exists(keys.lease(run_id)):
                        enqueue_advance(client, queue, run_id, force=True)
                        self.repaired.append(run_id)
        finally:
            client.close()

    @staticmethod
    def stalled(client: redis.Redis, now_ms: int) -> list[str]:
        """Active runs past their due time whose lease is gone."""
        due = {r.decode() for r in client.zrangebyscore(keys.DUE, "-inf", now_ms)}
        out = []
        for state in ACTIVE:
            for raw in client.zrange(keys.runs_in_state(state), 0, -1):
                run_id = raw.decode()
                if run_id in due and not client.exists(keys.lease(run_id)):
                    out.append(run_id)
        return out
