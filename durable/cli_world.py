"""``durable`` subcommands of the example world: ``world``, ``demo``, ``chaos``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def extend(add: Callable[..., Any]) -> None:
    pass
