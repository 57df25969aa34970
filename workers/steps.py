"""Small pure helpers of the step protocol: step keys, plain data, what an event records
of agent code (its drawn values, its traceback), and whether a lost reply's outcome is in
the log already."""

from __future__ import annotations

import traceback
from typing import Any

import msgspec

from durable.agents.configuration import model_used
from durable.errors import PayloadTooLarge
from durable.log import events as ev
from durable.log.blobs import Limits
from durable.log.state import RunState
from durable.log.store import Spec


def recorded(stale: RunState, fresh: RunState, pending: list[Spec]) -> bool:
    """Whether the outcome in ``pending`` (staged on ``stale``, observed once) is in the
    log already: the fresh log shows its action as the stale state does after it."""
    step = next((s.fields["step"] for s in pending if "step" in s.fields), None)
    if step is None:
        return False
    was, now = stale.actions.get(step), fresh.actions.get(step)
    return was is not None and now is not None and now.status != "dispatched" and \
        (now.status, now.attempts, now.resolution) == (was.status, was.attempts,
                                                       was.resolution)


#: How much of an agent code's traceback a quarantine keeps (its end: the raising frames).
TRACEBACK_BYTES = 8192


def agent_traceback(exc: BaseException) -> str:
    """The traceback of an exception raised in agent code, its last ``TRACEBACK_BYTES``."""
    text = "".join(traceback.format_exception(exc))
    if len(text) > TRACEBACK_BYTES:
        text = "...\n" + text[-TRACEBACK_BYTES:]
    return text


def values_field(values: list[Any]) -> dict[str, Any]:
    """The ``values`` field of an intent or a wait, when the agent drew any."""
    return {"values": values} if values else {}


def ran_under(state: RunState, model: bool) -> dict[str, Any]:
    """The ``ran_under`` field of a model step's intent: the model and prompt digest of the
    run's pin (``durable.agents.configuration.model_used``); nothing for any other step."""
    used = model_used(state.config) if model else ""
    return {"ran_under": used} if used else {}


def step_key(run_id: str, step: int) -> str:
    """The idempotency key of a step: stable across attempts and workers."""
    return f"{run_id}:{step}"


def plain(value: Any) -> Any:
    """JSON-like data only (what the log can carry and every reader can decode)."""
    return msgspec.json.decode(msgspec.json.encode(value))


#: The reason of a run failed by a result over ``DURABLE_MAX_RESULT_BYTES``.
RESULT_TOO_LARGE = "result_too_large"


def finished(result: Any, limits: Limits) -> Spec:
    """The event that ends a run with ``result``: ``completed`` (the result as plain data,
    in the event), or ``failed`` naming ``PayloadTooLarge`` when its JSON is over
    ``DURABLE_MAX_RESULT_BYTES``, as a step's result over it fails the step: it would be
    written whole into the run's log, and read back whole by everything that reads the
    run. The steps' own results stay in the log as evidence."""
    data = msgspec.json.encode(result)
    if len(data) > limits.ceiling:
        too = PayloadTooLarge("the run's result", len(data), limits.ceiling)
        return Spec(ev.Failed, {"error": f"{too} (DURABLE_MAX_RESULT_BYTES)",
                                "reason": RESULT_TOO_LARGE})
    return Spec(ev.Completed, {"result": msgspec.json.decode(data)})
