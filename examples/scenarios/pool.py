"""A pool of worker processes under fire: SIGKILL one at random, replace every dead one.

Some replacements carry a fault point (``kill_at="<window>:<step>"``, see
``durable.testing.faults``), so that besides kills at random moments the pool also dies
exactly inside the step protocol's windows (after the intent, after the effect, after the
outcome). Every death is recorded with the runs whose lease the dead worker held, so that
the time each one took to come back can be read from its log afterwards.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from durable.log import keys
from durable.testing import Worker

WINDOWS = ("after_intent", "after_effect", "after_outcome")


@dataclass
class Death:
    pid: int
    ts_ms: int
    #: ``sigkill`` (killed from outside at a random moment) or the fault point it hit.
    how: str
    #: Runs whose lease the worker held when it died.
    runs: list[str] = field(default_factory=list)


def leases(client: redis.Redis, layout: keys.KeyLayout) -> dict[str, int]:
    """Each run whose lease is held -> the pid of the worker holding it (owner
    ``host:pid:tag``)."""
    held = {}
    for shard in layout.shard_ids():
        for raw in client.scan_iter(match=layout.pattern("lease", shard), count=1000):
            value = client.get(raw)
            if value is None:
                continue
            parts = value.decode().rsplit("|", 1)[0].split(":")
            if len(parts) == 3 and parts[1].isdigit():
                held[layout.run_of(raw.decode())] = int(parts[1])
    return held


def held_by(client: redis.Redis, layout: keys.KeyLayout, pid: int) -> list[str]:
    """Runs whose lease is held by the worker process ``pid``."""
    return [run for run, owner in leases(client, layout).items() if owner == pid]


class WorkerPool:
    """``spawn(fault_spec)`` starts a worker (``fault_spec``: a ``kill_at`` window, or "")."""

    def __init__(self, spawn: Callable[[str], Worker], size: int, client: redis.Redis,
                 layout: keys.KeyLayout, rng: random.Random, fault_rate: float = 0.3,
                 steps: int = 4) -> None:
        self.spawn, self.size, self.client, self.rng = spawn, size, client, rng
        self.layout = layout
        self.fault_rate, self.steps = fault_rate, steps
        self.workers: dict[int, tuple[Worker, str]] = {}
        self.born: dict[int, float] = {}
        self.deaths: list[Death] = []
        self.started = 0

    def _new(self) -> None:
        spec = ""
        if self.started >= self.size and self.rng.random() < self.fault_rate:
            spec = f"{self.rng.choice(WINDOWS)}:{self.rng.randint(1, self.steps)}"
        w = self.spawn(spec)
        self.workers[w.pid] = (w, spec)
        self.born[w.pid] = time.monotonic()
        self.started += 1

    def start(self) -> WorkerPool:
        while len(self.workers) < self.size:
            self._new()
        return self

    def kill_random(self, min_age: float = 2.0, holding: bool = False) -> Death | None:
        """SIGKILL one live worker at a random moment of its work; replace it. None when no
        worker is a candidate (nothing killed).

        Only workers older than ``min_age`` seconds are candidates, and with ``holding`` only
        those holding at least one run's lease: a worker still importing its modules holds
        nothing, and killing it tests nothing."""
        ready = time.monotonic() - min_age
        alive = [pid for pid, (w, _) in self.workers.items()
                 if w.alive() and self.born[pid] <= ready]
        if holding:
            owners = self.lease_owners()
            alive = [pid for pid in alive if pid in owners]
        if not alive:
            return None
        pid = self.rng.choice(alive)
        worker, spec = self.workers.pop(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended by itself since it was seen alive: reap() it
            self.workers[pid] = (worker, spec)
            return None
        ts = int(time.time() * 1000)
        worker.proc.wait()
        death = Death(pid, ts, "sigkill", held_by(self.client, self.layout, pid))
        self.deaths.append(death)
        self._new()
        return death

    def lease_owners(self) -> set[int]:
        """The pids of the workers that hold at least one run's lease."""
        return set(leases(self.client, self.layout).values())

    def reap(self) -> list[Death]:
        """Record and replace the workers that died by themselves (at a fault point)."""
        found = []
        for pid, (worker, spec) in list(self.workers.items()):
            if worker.alive():
                continue
            del self.workers[pid]
            how = f"fault point {spec}" if spec else f"exit {worker.proc.returncode}"
            death = Death(pid, int(time.time() * 1000), how, held_by(self.client, self.layout, pid))
            found.append(death)
            self._new()
        self.deaths += found
        return found

    def stop(self) -> None:
        for worker, _ in self.workers.values():
            worker.stop()
        self.workers.clear()
