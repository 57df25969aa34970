"""Loads the Lua scripts that live next to this module, one ``.lua`` file each.

Constants the scripts share with Python are rendered into them from one Python source: a
script writes ``{--[[NAME]]}`` (an empty Lua table, so the file stays valid Lua) where the
set ``RENDERED[NAME]`` goes, as ``{member = true, ...}``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import redis

from durable.log.state import TERMINAL

#: Sets rendered into the scripts (see above).
RENDERED: dict[str, frozenset[str]] = {"TERMINAL": TERMINAL}


def lua_set(members: frozenset[str]) -> str:
    return "{" + ", ".join(f"{m} = true" for m in sorted(members)) + "}"


@cache
def source(name: str) -> str:
    text = (Path(__file__).parent / "scripts" / f"{name}.lua").read_text()
    for constant, members in RENDERED.items():
        text = text.replace(f"{{--[[{constant}]]}}", lua_set(members))
    return text


class Scripts:
    """The registered scripts of one connection, called by name (EVALSHA, reloaded on need)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._scripts: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        script = self._scripts.get(name)
        if script is None:
            script = self._client.register_script(source(name))
            self._scripts[name] = script
        return script
