"""Durations as people write them in settings and options: ``30d``, ``12h``, ``90m``,
``45s``, ``500ms`` (a bare number is seconds)."""

from __future__ import annotations

import re

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
