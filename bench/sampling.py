"""Processes sampled every few milliseconds by a thread: their peak memory and threads
(``PeakSampler``, ``bench.iobound``), or their CPU time with the wall clock (``CpuTrace``),
so the CPU spent inside a window known only afterwards (the first and last log writes of a
batch) can be read back; and the one-off readings taken around a batch: a process's RSS and
CPU seconds, Redis's, the whole machine's.

The throughput item reports that CPU per step: how much of a core the worker and Redis each
need per step is what bounds steps/s on a machine with few cores, whatever the round trips.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Self

import psutil
import redis

#: Seconds between samples.
INTERVAL_S = 0.02


class ProcessSampler:
    """Calls ``sample`` on entry, every ``interval`` seconds meanwhile (a thread), and on
    exit."""

    def __init__(self, pids: Sequence[int], interval: float = INTERVAL_S) -> None:
        self.procs = [psutil.Process(pid) for pid in pids]
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__,
                                        daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()


class CpuTrace(ProcessSampler):
    """The user+system CPU seconds of ``pids``, with the wall clock of each sample."""

    def __init__(self, pids: Sequence[int]) -> None:
        super().__init__(pids)
        self.times: list[float] = []
        self.samples: list[list[float]] = []
        self._last = [0.0] * len(self.procs)

    def sample(self) -> None:
        now = time.time()
        for i, proc in enumerate(self.procs):
            try:
                t = proc.cpu_times()
                self._last[i] = t.user + t.system
            except psutil.Error:  # it exited: its CPU stays at its last sample
                pass
        self.times.append(now)
        self.samples.append(list(self._last))

    def at(self, when: float) -> list[float]:
        """Each process's CPU seconds at wall time ``when`` (linear between samples)."""
        i = bisect.bisect_left(self.times, when)
        if i <= 0:
            return list(self.samples[0])
        if i >= len(self.times):
            return list(self.samples[-1])
        t0, t1 = self.times[i - 1], self.times[i]
        f = (when - t0) / (t1 - t0) if t1 > t0 else 1.0
        return [a + (b - a) * f for a, b in zip(self.samples[i - 1], self.samples[i],
                                                 strict=True)]

    def between(self, start: float, end: float) -> list[float]:
        """Each process's CPU seconds spent from ``start`` to ``end`` (wall clock)."""
        return [b - a for a, b in zip(self.at(start), self.at(end), strict=True)]


class PeakSampler(ProcessSampler):
    """Peak RSS and threads of some processes."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(pids)
        self.rss = [0.0] * len(pids)
        self.threads = [0] * len(pids)

    def sample(self) -> None:
        for i, p in enumerate(self.procs):
            with contextlib.suppress(psutil.Error):
                self.rss[i] = max(self.rss[i], p.memory_info().rss / 2**20)
                self.threads[i] = max(self.threads[i], p.num_threads())


def rss_mb(pid: int) -> float:
    """The process's RSS now, MB (nan when it is gone)."""
    try:
        return float(psutil.Process(pid).memory_info().rss / 2**20)
    except psutil.Error:
        return float("nan")


def cpu_s(pid: int) -> float:
    """The process's user+system CPU seconds so far (nan when it is gone)."""
    try:
        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)
    except psutil.Error:
        return float("nan")


def own_cpu_s() -> float:
    """This process's user+system CPU seconds so far."""
    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


def redis_cpu_s(r: redis.Redis) -> float:
    """The server's user+system CPU seconds so far (``INFO cpu``)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"] + info["used_cpu_sys"])


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every core, every process)."""
    t = psutil.cpu_times()
    return float(t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0)
                 + getattr(t, "softirq", 0))
