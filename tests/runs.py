"""What tests read of a run and of the workers' counters, in one place: its events and
their types, whether a step is in flight, a stat, who listens for cancels."""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.testing.processes import Process, wait_for


def events_of(client: Client, run: str) -> list[ev.Event]:
    """The run's decoded events, in log order."""
    return [e.event for e in client.events(run) if e.event is not None]


def types_of(client: Client, run: str) -> list[str]:
    """The run's event types (``run_started``, ``step_decided``...), in log order."""
    return [str(e.__struct_config__.tag) for e in events_of(client, run)]


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


def deaf_listeners_report(r: redis.Redis, procs: Sequence[Process]) -> str:
    """Why fewer processes listen for cancels than should: the pub/sub clients Redis knows,
    then each process's stacks (SIGUSR1 makes it print them) and the end of its log."""
    try:
        clients = "\n".join(f"  {c.get('addr')} name={c.get('name')} sub={c.get('sub')} "
                            f"cmd={c.get('cmd')}" for c in r.client_list(_type="pubsub"))
    except redis.RedisError as exc:
        clients = f"  (CLIENT LIST failed: {exc})"
    for p in procs:
        p.send(signal.SIGUSR1)
    parts = [f"{cancel_listeners(r)} listen on the cancel channel; pub/sub clients:\n{clients}"]
    for p in procs:
        path = p.log_path
        if path is None:
            continue

        def dumped(path: Path = path) -> bool:
            return "most recent call first" in path.read_text()

        wait_for(dumped, 3)
        blocks = path.read_text().split("\n\n")
        stacks = [b for b in blocks if "most recent call first" in b
                  and ("subscriber.py" in b or "listener.py" in b)]
        lines = [line for line in path.read_text().splitlines()
                 if line[:4].isdigit()]  # the log's own lines, not the stacks
        parts += [f"--- {path.name} (alive: {p.alive()}) ---", *lines[-40:],
                  "listener stacks:", *stacks]
    return "\n".join(parts)


def killed_at_step_2_then_resumed(client: Client, worker: Callable[..., Any],
                                  reconciler: Callable[..., Any], world: str, agent: str,
                                  run_id: str, window: str) -> None:
    """A three-step writer run whose first worker is SIGKILLed at ``window`` of step 2,
    then resumed by another worker and a reconciler: it completes with its three rows,
    each applied once in the ``world`` database, and its log verifies."""
    from durable.audit.verify import verify
    from tests.agents.basic import applications

    run = client.start(agent, {"steps": 3}, run_id=run_id).run_id
    doomed = worker(kill_at=f"{window}:2")
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=30)
    assert final.state == "completed"
    assert final.result == {"rows": [f"{run}:1", f"{run}:2", f"{run}:3"]}
    assert applications(world) == {f"{run}:{n}": 1 for n in (1, 2, 3)}
    assert verify(client.log, run).ok
