"""Durations as people write them in settings and options: ``30d``, ``12h``, ``90m``,
``45s``, ``500ms`` (a bare number is seconds)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, ValidationInfo

from durable.errors import UsageError

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
             "w": 604_800_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration_ms(text: str) -> int:
    """Milliseconds in ``text``; a ``UsageError`` naming it otherwise."""
    found = _DURATION.match(text or "")
    if not found:
        raise UsageError(f"not a duration: {text!r} (use e.g. 30d, 12h, 90m, 45s)")
    ms = int(float(found.group(1)) * _UNITS_MS[found.group(2) or "s"])
    if ms <= 0:
        raise UsageError(f"a duration must be positive: {text!r}")
    return ms




def _retention(text: str | None) -> str | None:
    """A retention setting: a duration, or unset; else a ``ValueError``, which the settings
    report under the variable's name."""
    if text is not None:
        try:
            parse_duration_ms(text)
        except UsageError as exc:
            raise ValueError(str(exc)) from None
    return text


def _within(text: str | None, info: ValidationInfo) -> str | None:
    """Model context (``DURABLE_CONTEXT_RETENTION``) is removed before the run's evidence
    (``DURABLE_RETENTION``, validated before it), or with it; never after."""
    context, retention = _retention(text), info.data.get("retention")
    if context is not None and retention is not None and \
            parse_duration_ms(context) > parse_duration_ms(retention):
        raise ValueError(f"DURABLE_CONTEXT_RETENTION={context} is longer than "
                         f"DURABLE_RETENTION={retention}: a run's model context is removed "
                         "before its evidence, or with it, never after")
    return context


#: The types of ``DURABLE_RETENTION`` and ``DURABLE_CONTEXT_RETENTION`` (``LogSettings``).
Retention = Annotated[str | None, AfterValidator(_retention)]
ContextRetention = Annotated[str | None, AfterValidator(_within)]
