"""Per-run leases with fencing: who may write a run's log right now.

A lease is ``dx:{R}:lease = "<owner token>|<epoch>"`` with a PX time to live. The epoch
comes from ``dx:{R}:fence`` and grows on every acquisition, and ``append.lua`` compares the
whole value on every worker append: a worker that lost its lease (paused, partitioned,
expired) cannot write, even if nobody else took the lease yet. Lease state is never
business state: it is not in the log's fold.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import redis

from durable import keys
from durable.scripts import Scripts


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class Lease:
    run_id: str
    value: str  # "<token>|<epoch>"

    @property
    def epoch(self) -> int:
        return int(self.value.rsplit("|", 1)[1])

    @property
    def owner(self) -> str:
        return self.value.rsplit("|", 1)[0]


class Leases:
    def __init__(self, client: redis.Redis, ttl_ms: int) -> None:
        self.scripts = Scripts(client)
        self.redis = client
        self.ttl_ms = ttl_ms

    def acquire(self, run_id: str, token: str) -> Lease | None:
        """A new lease (new epoch), or None while another owner holds one."""
        reply = self.scripts.lease_acquire(
            keys=[keys.lease(run_id), keys.fence(run_id)], args=[token, self.ttl_ms]
        )
        if _s(reply[0]) != "ok":
            return None
        return Lease(run_id, _s(reply[1]))

    def renew(self, lease: Lease) -> bool:
        return bool(self.scripts.lease_renew(keys=[keys.lease(lease.run_id)],
                                             args=[lease.value, self.ttl_ms]))

    def release(self, lease: Lease) -> bool:
        return bool(self.scripts.lease_release(keys=[keys.lease(lease.run_id)], args=[lease.value]))

    def holder(self, run_id: str) -> str | None:
        value = self.redis.get(keys.lease(run_id))
        return _s(value) if value is not None else None


class Heartbeat:
    """Renews a lease every third of its TTL until stopped; calls ``on_lost`` once if it fails."""

    def __init__(self, leases: Leases, lease: Lease, on_lost: object) -> None:
        self.leases, self.lease = leases, lease
        self._on_lost = on_lost
        self._stop = threading.Event()
        self.lost = False
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{lease.run_id}",
                                        daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        interval = self.leases.ttl_ms / 3000
        while not self._stop.wait(interval):
            try:
                ok = self.leases.renew(self.lease)
            except redis.RedisError:
                continue
            if not ok:
                self.lost = True
                if callable(self._on_lost):
                    self._on_lost()
                return
