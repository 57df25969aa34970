"""The LangGraph task the running code belongs to, as LangGraph's runtime tells it
(``get_runtime().execution_info``): its id (which LangGraph derives from the checkpoint it
runs from and its place in the graph: the same task has the same id when it runs again from
that checkpoint), the attempt its ``RetryPolicy`` is at, and its node. Outside a task (no
LangGraph runtime in the context): ``OUTSIDE``."""

from __future__ import annotations

from dataclasses import dataclass

from langgraph.config import get_config
from langgraph.runtime import get_runtime

__all__ = ["OUTSIDE", "Task", "current"]


@dataclass(frozen=True)
class Task:
    id: str
    attempt: int
    node: str


OUTSIDE = Task("-", 1, "")


def current() -> Task:
    """The task the running code belongs to (``OUTSIDE`` if none)."""
    try:
        info = get_runtime().execution_info
        config = get_config()
    except (RuntimeError, KeyError, AttributeError):
        return OUTSIDE
    if info is None:
        return OUTSIDE
    node = str((config.get("metadata") or {}).get("langgraph_node") or "")
    return Task(str(info.task_id), int(info.node_attempt or 1), node)
