"""What tests read of a run and of the workers' counters, in one place: its events and
their types, whether a step is in flight, a stat, who listens for cancels."""

from __future__ import annotations

import redis

from durable.client import Client
from durable.log import events as ev
from durable.log import keys


def events_of(client: Client, run: str) -> list[ev.Event]:
    """The run's decoded events, in log order."""
    return [e.event for e in client.events(run) if e.event is not None]


def types_of(client: Client, run: str) -> list[str]:
    """The run's event types (``run_started``, ``step_decided``...), in log order."""
    return [e.__struct_config__.tag for e in events_of(client, run)]


def is_dispatched(client: Client, run: str, step: int | None = None) -> bool:
    """Whether ``step`` (the current step by default) is dispatched, with no outcome yet."""
    state = client.status(run)
    act = state.current if step is None else state.actions.get(step)
    return act is not None and act.status == "dispatched"


def stat_of(r: redis.Redis, name: str) -> int:
    """A counter of ``dx:stats`` (``cancel_forged``, ``stuck_calls``...), 0 when unset."""
    return int(r.hget(keys.STATS, name) or 0)


def cancel_listeners(r: redis.Redis) -> int:
    """How many clients listen on the cancel channel (workers, reconcilers)."""
    return int(dict(r.pubsub_numsub(keys.CANCEL_CHANNEL)).get(keys.CANCEL_CHANNEL.encode(), 0))
