"""The worker's step protocol on the caller's thread, for ``durable.testing``'s
``AgentEnvironment`` (entry point ``worker`` of the ``durable.testing`` group): the same
``StepLoop`` a worker process runs, without RQ, a pool, heartbeats or a cancel listener."""

from __future__ import annotations

from typing import Any

import redis

from durable.agents import Registry
from durable.agents.cancel_token import CancelToken
from durable.log.state import Action
from durable.settings import Settings

from .loop import StepLoop


class StepDriver:
    def __init__(self, settings: Settings, client: redis.Redis, registry: Registry,
                 worker_id: str) -> None:
        self.loop = StepLoop(settings, client, registry, worker_id)

    def advance(self, run_id: str) -> bool:
        """Drive ``run_id`` until it needs no worker; True when it was made ready again."""
        return bool(self.loop.advance(run_id).get("more"))

    def call_tool(self, tool: str, args: dict[str, Any], *, run_id: str, step: int,
                  key: str, deadline_ms: int, attempt: int) -> tuple[str, dict[str, Any]]:
        """One dispatch of ``tool`` (deadline, quick retries, outcome rules): the type and
        fields of the event a worker would record."""
        act = Action(step=step, tool=tool, args=args, key=key, status="dispatched",
                     attempts=attempt, deadline=deadline_ms)
        specs = self.loop.dispatcher.dispatch(run_id, self.loop.registry.tool(tool), act,
                                              CancelToken(), args)
        first = specs[0]
        return str(first.cls.__struct_config__.tag), dict(first.fields)

    def close(self) -> None:
        self.loop.stopping.set()
