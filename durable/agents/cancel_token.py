"""The cancel a tool sees: the token it is given (``ToolContext.token``: checked, waited on,
listened to) and the signals raised inside it (``Cancelled`` after a cancel, ``Overrun`` past
its deadline or its cancel's grace period).

A cancel reaches a token from the worker's listener (``durable.backend.subscriber``, the
pub/sub hint of ``durable.backend.cancel_messages``) or from the run's log; what records and
ends a cancel is ``durable.controls.cancellation``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from durable.errors import Signal

__all__ = ["CancelToken", "Cancelled", "Overrun"]


class Cancelled(Signal):
    """Raised inside a tool that checks its token after a cancel.

    A ``BaseException``, like ``KeyboardInterrupt``: a tool's ``except Exception`` does
    not swallow it.
    """


class Overrun(Cancelled):
    """Raised inside a tool call that ran past its deadline, or past its cancel's grace
    period: the worker stops it and records its outcome as unknown."""


class CancelToken:
    def __init__(self) -> None:
        self._event = threading.Event()
        self._listeners: list[Callable[[], object]] = []
        self.reason = ""

    def cancel(self, reason: str = "") -> None:
        self.reason = reason
        self._event.set()
        for listener in list(self._listeners):
            listener()

    def add_listener(self, fn: Callable[[], object]) -> None:
        self._listeners.append(fn)
        if self._event.is_set():
            fn()

    def remove_listener(self, fn: Callable[[], object]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise ``Cancelled`` if a cancel was signalled."""
        if self._event.is_set():
            raise Cancelled(self.reason)

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True (early) when cancelled."""
        return self._event.wait(timeout)
