"""CPU time of processes, sampled with the wall clock, so the CPU spent inside a window known
only afterwards (the first and last log writes of a batch) can be read back.

The throughput item reports it per step: how much of a core the worker and Redis each need
per step is what bounds steps/s on a machine with few cores, whatever the round trips.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence

import psutil

#: Seconds between samples.
INTERVAL_S = 0.02


class CpuTrace:
    """Samples ``pids``' user+system CPU seconds every ``INTERVAL_S`` (a thread)."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.procs = [psutil.Process(pid) for pid in pids]
        self.times: list[float] = []
        self.samples: list[list[float]] = []
        self._last = [0.0] * len(self.procs)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-trace", daemon=True)

    def __enter__(self) -> CpuTrace:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._sample()

    def _sample(self) -> None:
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
