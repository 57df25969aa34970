"""Loads the Lua scripts that live next to this module, one ``.lua`` file each."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import redis


@cache
def source(name: str) -> str:
    return (Path(__file__).parent / "scripts" / f"{name}.lua").read_text()


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
