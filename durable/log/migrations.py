"""Upcasters: turn an event written at an older schema version into the current one.

Register one function per (event type, from version); each returns the entry at
``from_version + 1``. ``upcast`` chains them up to the current ``SCHEMA_VERSION`` (kept in
``durable.log.events``). Every upcaster has a test that decodes a fixture written at the old
version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durable.errors import DecodeError

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

#: (event type, from version) -> function. ``"*"`` matches every type.
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def register(event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    def wrap(fn: Upcaster) -> Upcaster:
        UPCASTERS[(event_type, from_version)] = fn
        return fn

    return wrap


@register("*", 1)
def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v1 -> v2: a v1 run recorded no runtime identity, so it started under version "1"."""
    if data.get("type") == "run_started":
        data.setdefault("agent_version", "1")
        data.setdefault("tools", [])
        if not data.get("agent_version"):
            data["agent_version"] = "1"
    return data


@register("*", 2)
def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """v2 -> v3: v3 only added the optional ``blob`` reference of outcomes; a v2 entry
    reads the same."""
    return data


@register("*", 3)
def _v3_to_v4(data: dict[str, Any]) -> dict[str, Any]:
    """v3 -> v4: v4 changed the wire form only (positional, the envelope left to the
    entry's place); a v3 map holds every field by name and reads the same."""
    return data


def upcast(raw: dict[str, Any], to_version: int, entry_id: str = "?") -> dict[str, Any]:
    """Chain the upcasters from ``raw``'s version to ``to_version`` (the schema's current)."""
    data = dict(raw)
    while data.get("v", 0) < to_version:
        v = int(data.get("v", 0))
        fn = UPCASTERS.get((str(data.get("type")), v)) or UPCASTERS.get(("*", v))
        if fn is None:
            raise DecodeError(entry_id, f"no migration for {data.get('type')} from v{v}")
        data = fn(data)
        data["v"] = v + 1
    return data
