"""A crash window named by the step's role rather than its number: ``KillAtCall`` is a step
hook that SIGKILLs its worker at ``window`` of the ``nth`` step of ``tool`` in the run's log
(``durable worker --hook tests.servers.kills:KillAtCall=after_effect:lg_booker.model:2``).

A LangGraph run's step numbers depend on how its checkpoint entries were grouped into
records (entries put within a few turns of the event loop share one), which the timing of
its tasks decides; the n-th model request or tool call of a run is the same whatever that
grouping. The hook reads the run's log (the worker's Redis, ``DURABLE_REDIS_URL``) at each
window it may die at.
"""

from __future__ import annotations

import os
import signal

from durable.client import Client
from durable.log import events as ev
from durable.settings import Settings
from durable.testing.faults import WINDOWS


class KillAtCall:
    def __init__(self, spec: str) -> None:
        window, tool, nth = spec.split(":")
        if window not in WINDOWS or not nth.isdigit():
            raise ValueError(f"kill-at-call {spec!r}: expected <window>:<tool>:<n>")
        self.window, self.tool, self.nth = window, tool, int(nth)
        self.client: Client | None = None

    def _maybe_die(self, window: str, run_id: str, step: int) -> None:
        if window != self.window:
            return
        if self.client is None:
            self.client = Client(Settings())
        steps = [e.event.step for e in self.client.events(run_id)
                 if isinstance(e.event, ev.StepDecided) and e.event.tool == self.tool]
        if len(steps) >= self.nth and steps[self.nth - 1] == step:
            os.kill(os.getpid(), signal.SIGKILL)

    def after_intent(self, run_id: str, step: int) -> None:
        self._maybe_die("after_intent", run_id, step)

    def after_effect(self, run_id: str, step: int) -> None:
        self._maybe_die("after_effect", run_id, step)

    def after_outcome(self, run_id: str, step: int) -> None:
        self._maybe_die("after_outcome", run_id, step)
