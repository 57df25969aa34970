"""Hooks on the step loop's crash windows: where tests, chaos and (later) metrics and tracing
attach, instead of checks written into the loop.

The windows, in the order a step passes them:

- ``after_intent``: the intent and the ledger claim are recorded; nothing was sent.
- ``after_effect``: the tool returned; its outcome is not recorded yet.
- ``after_outcome``: the outcome is recorded (with the next intent, when there is one).

and, for observers (the worker's own metrics, ``workers.metrics``):

- ``step_done(tool, outcome, seconds)``: a call returned (right after ``after_effect``);
  ``outcome`` is the label of the event that records it (``durable.log.counters.OUTCOMES``).

A worker is given hooks with ``durable worker --hook MODULE:ATTR[=ARG]``: ``ATTR`` is called
(with ``ARG`` when given) and returns an object with any of these methods.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from durable.errors import UsageError


class StepHooks:
    """No-op hooks; override the windows you need."""

    def after_intent(self, run_id: str, step: int) -> None:
        """The intent and the claim of its key are recorded; nothing was sent."""

    def after_effect(self, run_id: str, step: int) -> None:
        """The tool returned; what it observed is not recorded yet."""

    def after_outcome(self, run_id: str, step: int) -> None:
        """The step's outcome is in the log."""

    def step_done(self, tool: str, outcome: str, seconds: float) -> None:
        """A dispatched call returned with ``outcome`` after ``seconds``."""


class HookChain(StepHooks):
    """Calls each hook of a list in order."""

    def __init__(self, hooks: Sequence[Any] = ()) -> None:
        self.hooks = list(hooks)

    def _emit(self, window: str, run_id: str, step: int) -> None:
        for hook in self.hooks:
            fn = getattr(hook, window, None)
            if fn is not None:
                fn(run_id, step)

    def after_intent(self, run_id: str, step: int) -> None:
        self._emit("after_intent", run_id, step)

    def after_effect(self, run_id: str, step: int) -> None:
        self._emit("after_effect", run_id, step)

    def after_outcome(self, run_id: str, step: int) -> None:
        self._emit("after_outcome", run_id, step)

    def step_done(self, tool: str, outcome: str, seconds: float) -> None:
        for hook in self.hooks:
            fn = getattr(hook, "step_done", None)
            if fn is not None:
                fn(tool, outcome, seconds)


def load_hook(spec: str) -> Any:
    """``MODULE:ATTR`` or ``MODULE:ATTR=ARG``: import ``ATTR`` and call it (with ``ARG``)."""
    target, sep, arg = spec.partition("=")
    module, colon, attr = target.partition(":")
    if not colon or not module or not attr:
        raise UsageError(f"hook {spec!r}: expected MODULE:ATTR or MODULE:ATTR=ARG")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"hook {spec!r}: {exc}") from None
    return factory(arg) if sep else factory()


def load_hooks(specs: Sequence[str]) -> HookChain:
    return HookChain([load_hook(s) for s in specs])
