"""The command handlers RQ calls: the only functions a queued job may name
(``durable.queue.HANDLERS``). Each hands its command to this process's step loop."""

from __future__ import annotations

from typing import Any

from .runtime import current_loop, current_pool


def advance(run_id: str) -> dict[str, Any]:
    """Drive one run forward in this worker process."""
    return current_loop().advance(run_id)


def drain(queue_name: str) -> dict[str, object]:
    """Fill this worker's free run slots from the ready list."""
    return current_pool().slots.drain(queue_name)
