"""The reconciler's sweep on the caller's thread, for ``durable.testing``'s
``AgentEnvironment`` (entry point ``reconciler`` of the ``durable.testing`` group)."""

from __future__ import annotations

import redis

from durable.agents import Registry
from durable.settings import Settings

from .sweep import Sweeper


class Sweep:
    def __init__(self, settings: Settings, client: redis.Redis, registry: Registry) -> None:
        self.reconciler = Sweeper(settings, client, registry)

    def tick(self, now: int) -> dict[str, str]:
        """One sweep of every run due at ``now`` (ms); run id -> what was done."""
        return dict(self.reconciler.tick(now=now).actions)
