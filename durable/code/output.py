"""Partial output of a code agent's function itself (``RunContext.emit``), not of a step:
what a framework running inside the function streams of its own (LangGraph's
``get_stream_writer()`` chunks, its node updates) goes to the run's followers, never into
the log.

Each message is a ``Partial`` of the step the function takes next, attempt 0 (a step's own
dispatches count from 1): a follower hands it out as soon as it hears it
(``durable.streams.partials.Order``), in the order the function emitted, and a follower that
joins later gets what is kept of it until that step's own dispatch begins to emit (or ten
minutes pass). It is published by the process's one output thread, so a function on the
event loop never waits on Redis for it; best-effort, as any partial output: a Redis fault
drops the message. Off a worker (no log bound: a dry run) it goes nowhere.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from durable.streams.partials import DEFAULT_KEEP_BYTES, CallOutput, Publisher

if TYPE_CHECKING:
    from durable.log.store import EventLog

__all__ = ["FunctionOutput", "publisher_of"]

#: The thread that publishes every function's partial output, in the order emitted.
_SENDER = ThreadPoolExecutor(1, thread_name_prefix="durable-function-output")


def publisher_of(log: EventLog | None) -> Publisher | None:
    """The publisher of partial output on ``log``'s Redis (its inline limit per message)."""
    if log is None:
        return None
    return Publisher(log.redis, log.limits.inline, DEFAULT_KEEP_BYTES, log.keys)


class FunctionOutput:
    """One execution's partial output (see the module's doc)."""

    def __init__(self, publisher: Publisher | None, run_id: str) -> None:
        self.publisher, self.run_id = publisher, run_id
        self._call: CallOutput | None = None
        #: Messages handed to the output thread.
        self.emitted = 0

    def emit(self, step: int, data: Any) -> None:
        """Publish ``data`` as partial output of ``step`` (attempt 0)."""
        if self.publisher is None:
            return
        call = self._call
        if call is None or call.step != step:
            call = self._call = self.publisher.for_call(self.run_id, step, 0)
        self.emitted += 1
        _SENDER.submit(call, data)
