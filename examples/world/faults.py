"""Faults the world injects into its effect endpoints, set through ``POST /control/faults``.

Kinds (each one keeps the world's contract: a fault never lies about what was applied):

- ``fail``: answer ``503`` without applying anything;
- ``drop``: apply, then close the connection without a reply (the model: answer, then cut
  the reply, or a stream halfway);
- ``slow``: with phase ``reply``, apply at once and reply ``slow_s`` seconds later (past the
  caller's timeout); with phase ``apply``, hold the request ``slow_s`` seconds *before*
  applying, so that it reaches the point of applying after the caller's deadline and is
  refused (the deadline guarantee: a late first attempt never lands after a retry).

Besides faults, ``latency_ms: [lo, hi]`` delays every effect call by a random time in
that range before it is applied (network and service time), so that work takes a while
and a worker killed at a random moment is likely to be in the middle of a call.

Faults come from two sources: counted ones (``fail_next``, ``drop_next``, ``slow_next``:
the next N calls of a target, in that order) and random ones (``random``: probabilities per
call, seeded, with at most ``per_key`` faults for any one key). Lookups and aborts are
never faulted: they are how callers find out what happened.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Kind = Literal["fail", "drop", "slow"]
Phase = Literal["reply", "apply"]
#: The faultable endpoints: the notification API, the data source, the model.
TARGETS = ("notify", "source", "model")


@dataclass(frozen=True)
class Fault:
    kind: Kind
    slow_s: float = 0.0
    phase: Phase = "reply"

    def label(self) -> str:
        return f"slow-{self.phase}" if self.kind == "slow" else self.kind


@dataclass
class RandomFaults:
    p_fail: float = 0.0
    p_drop: float = 0.0
    p_slow: float = 0.0
    slow_s: float = 3.0
    #: ``reply``, ``apply`` or ``mixed`` (each slow fault picks one of the two).
    slow_phase: str = "mixed"
    seed: int = 0
    per_key: int = 1
    targets: list[str] = field(default_factory=lambda: list(TARGETS))


def _number(data: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = data.get(name, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be a number in [{lo}, {hi}]")
    return float(value)


class FaultPlan:
    """Thread-safe: every request handler asks it for the fault of its call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queued: dict[str, list[Fault]] = {t: [] for t in TARGETS}
        self.random: RandomFaults | None = None
        self.rng = random.Random(0)
        self.injected: Counter[str] = Counter()
        self.per_key: Counter[str] = Counter()
        self.latency_ms: tuple[float, float] = (0.0, 0.0)

    def configure(self, data: dict[str, Any]) -> None:
        """Add counted faults and/or replace the random ones. Raises ``ValueError``."""
        target = data.get("target", "notify")
        targets = list(TARGETS) if target == "any" else [target]
        if not set(targets) <= set(TARGETS):
            raise ValueError(f"target must be one of {', '.join(TARGETS)} or 'any'")
        slow_s = _number(data, "slow_s", 3.0, 0.0, 600.0)
        phase = data.get("slow_phase", "reply")
        if phase not in ("reply", "apply"):
            raise ValueError("slow_phase must be 'reply' or 'apply'")
        add: list[Fault] = []
        for kind in ("fail", "drop", "slow"):
            n = int(_number(data, f"{kind}_next", 0, 0, 1_000_000))
            add += [Fault(kind, slow_s, phase)] * n
        rand: RandomFaults | None = None
        if isinstance(data.get("random"), dict):
            r = data["random"]
            rand = RandomFaults(
                p_fail=_number(r, "p_fail", 0, 0, 1), p_drop=_number(r, "p_drop", 0, 0, 1),
                p_slow=_number(r, "p_slow", 0, 0, 1), slow_s=_number(r, "slow_s", 3, 0, 600),
                slow_phase=str(r.get("slow_phase", "mixed")), seed=int(r.get("seed", 0)),
                per_key=int(_number(r, "per_key", 1, 0, 1000)),
                targets=list(r.get("targets", TARGETS)))
            if rand.slow_phase not in ("reply", "apply", "mixed"):
                raise ValueError("random.slow_phase must be 'reply', 'apply' or 'mixed'")
            if not set(rand.targets) <= set(TARGETS):
                raise ValueError(f"random.targets must be among {', '.join(TARGETS)}")
        latency = self.latency_ms
        if "latency_ms" in data:
            raw = data["latency_ms"] or [0, 0]
            if not (isinstance(raw, list) and len(raw) == 2):
                raise ValueError("latency_ms must be [lo, hi] (milliseconds)")
            lo = _number({"lo": raw[0]}, "lo", 0, 0, 60_000)
            latency = (lo, _number({"hi": raw[1]}, "hi", 0, lo, 60_000))
        with self.lock:
            self.latency_ms = latency
            for t in targets:
                self.queued[t].extend(add)
            if "random" in data:
                self.random = rand
                self.rng = random.Random(rand.seed if rand else 0)

    def reset(self) -> None:
        with self.lock:
            self.queued = {t: [] for t in TARGETS}
            self.random = None
            self.per_key.clear()
            self.latency_ms = (0.0, 0.0)

    def count(self, label: str) -> None:
        with self.lock:
            self.injected[label] += 1

    def take(self, target: str, key: str) -> Fault | None:
        """The fault for this call, if any (and count it as injected)."""
        with self.lock:
            fault: Fault | None = None
            if self.queued.get(target):
                fault = self.queued[target].pop(0)
            elif self.random is not None and target in self.random.targets and (
                    self.per_key[key] < self.random.per_key):
                fault = self._draw(self.random)
            if fault is not None:
                self.injected[fault.label()] += 1
                self.per_key[key] += 1
            return fault

    def latency(self) -> float:
        """Seconds this call waits before it is applied."""
        with self.lock:
            lo, hi = self.latency_ms
            return self.rng.uniform(lo, hi) / 1000 if hi > 0 else 0.0

    def _draw(self, r: RandomFaults) -> Fault | None:
        x = self.rng.random()
        if x < r.p_fail:
            return Fault("fail")
        if x < r.p_fail + r.p_drop:
            return Fault("drop")
        if x < r.p_fail + r.p_drop + r.p_slow:
            phase = r.slow_phase if r.slow_phase != "mixed" else self.rng.choice(
                ["reply", "apply"])
            return Fault("slow", r.slow_s, phase)  # type: ignore[arg-type]
        return None

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "queued": {t: [f.label() for f in fs] for t, fs in self.queued.items()},
                "random": asdict(self.random) if self.random else None,
                "injected": dict(self.injected),
                "injected_total": sum(self.injected.values()),
                "latency_ms": list(self.latency_ms),
            }
