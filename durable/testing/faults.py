"""Fault injection at the step loop's named crash windows.

``KillAt("after_effect:2")`` is a step hook that SIGKILLs its own process when a run reaches
that window at that step: a real crash (no cleanup, no lease release, no last write), not an
exception. Give it to a worker process with
``durable worker --hook durable.testing.faults:KillAt=after_effect:2``, or
``Worker(url, kill_at="after_effect:2")``.

Windows: ``after_intent`` (intent and claim recorded, nothing sent), ``after_effect`` (tool
returned, outcome not recorded), ``after_outcome`` (outcome recorded).
"""

from __future__ import annotations

import os
import signal

WINDOWS = ("after_intent", "after_effect", "after_outcome")


class KillAt:
    def __init__(self, spec: str) -> None:
        window, _, step = spec.partition(":")
        if window not in WINDOWS or not step.isdigit():
            raise ValueError(f"kill-at {spec!r}: expected <window>:<step>, window one of "
                             f"{', '.join(WINDOWS)}")
        self.window, self.step = window, int(step)

    def _maybe_die(self, window: str, step: int) -> None:
        if window == self.window and step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)

    def after_intent(self, run_id: str, step: int) -> None:
        self._maybe_die("after_intent", step)

    def after_effect(self, run_id: str, step: int) -> None:
        self._maybe_die("after_effect", step)

    def after_outcome(self, run_id: str, step: int) -> None:
        self._maybe_die("after_outcome", step)
