"""The global indexes are derived data: rebuild them from the run projections and logs."""

from __future__ import annotations

from typing import Any

from durable.log import keys
from durable.log.state import ALL_STATES


def repair(client: Any) -> int:
    """Rebuild ``dx:runs``, ``dx:runs:<state>`` and the due-set from every run's log."""
    r = client.redis
    pipe = r.pipeline(transaction=False)
    pipe.delete(keys.RUNS_BY_UPDATE, keys.DUE, *[keys.runs_in_state(s) for s in ALL_STATES])
    pipe.execute()
    count = 0
    for raw in r.scan_iter(match=f"{keys.PREFIX}:{{*}}:log", count=500):
        name = raw.decode()
        run_id = name[len(keys.PREFIX) + 2: -len("}:log")]
        try:
            handle = client.log.load(run_id)
        except Exception:
            continue
        state = handle.state
        pipe.zadd(keys.RUNS_BY_UPDATE, {run_id: state.updated})
        pipe.zadd(keys.runs_in_state(state.state), {run_id: state.updated})
        pipe.hset(keys.run(run_id), mapping={"state": state.state, "version": state.version,
                                             "step": state.step})
        due = client.log.due_for(state, state.updated)
        if due != "-":
            pipe.zadd(keys.DUE, {run_id: int(due)})
        count += 1
    pipe.execute()
    return count
