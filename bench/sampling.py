"""Processes sampled every few milliseconds by a thread: their peak memory and threads
(``bench.iobound``), or their CPU time with the wall clock (``CpuTrace``), so the CPU spent
inside a window known only afterwards (the first and last log writes of a batch) can be
read back.

The throughput item reports that CPU per step: how much of a core the worker and Redis each
need per step is what bounds steps/s on a machine with few cores, whatever the round trips.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence
from typing import Self

import psutil

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
