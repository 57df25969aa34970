"""A node's or a task's execution inside a durable LangGraph run: its attempts (each
``interrupt()`` it raises a durable wait, the next attempt given the answers so far, as
LangGraph resumes it), the step that records what it returned (``<name>.node.<node>``,
``<name>.task``), and the functional API's ``@task`` calls made durable (``install``).

A ``@task`` call is named by the node or task that makes it and its place among that
caller's calls (``<caller>>fn#n``). Its output is recorded as the step ``<name>.task`` and
kept by its caller: a caller LangGraph runs again within one execution (an ``@entrypoint``
whose ``interrupt()`` was answered) gets the task's output without running it again, as
LangGraph's own resume does from its checkpoint.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from langchain_core.load import dumpd, load
from langgraph._internal._constants import CONFIG_KEY_SCRATCHPAD
from langgraph.config import get_config
from langgraph.errors import GraphInterrupt
from langgraph.func import _TaskFunction

from durable.agents import ToolContext
from durable.integrations.base import EffectFreeStep, jsonable
from durable.integrations.langgraph.run import Binding, GraphOwner, NodeTask, bound_run, node_task

__all__ = ["INTERRUPT_TIMEOUT_S", "NodeStep", "NodeUpdate", "attempts", "install", "replayed"]

#: How long an ``interrupt()`` waits for its answer by default (s): a week.
INTERRUPT_TIMEOUT_S = 7 * 86400.0


def _asked(exc: GraphInterrupt) -> Any:
    """What an ``interrupt()`` asked, as the wait's data: its value (or the values)."""
    asked = [jsonable(i.value) for i in (exc.args[0] if exc.args else ())]
    return asked[0] if len(asked) == 1 else asked


def _resume(config: Any, answers: list[Any]) -> None:
    """Give the task the answers to its interrupts so far, in order: LangGraph's
    ``interrupt()`` returns them (its counter starts again, as for a resumed task). The
    task's own scratchpad is changed: the code reads it from the context LangGraph set."""
    pad = ((config or {}).get("configurable") or {}).get(CONFIG_KEY_SCRATCHPAD)
    if pad is None:
        raise RuntimeError("LangGraph gave the node no scratchpad: interrupt() cannot be "
                           "answered")
    # The scratchpad is a frozen dataclass: its counter is set as its own __init__ sets it.
    object.__setattr__(pad, "interrupt_counter", itertools.count().__next__)
    pad.resume[:] = answers


async def attempts(b: Binding, what: str, invoke: Callable[[], Awaitable[Any]],
                   config: Any, task: NodeTask) -> Any:
    """Run a node (or task) until it returns: each ``interrupt()`` it raises is a durable
    wait, and it runs again with the answers given so far, its steps' outcomes kept."""
    answers: list[Any] = []
    while True:
        task.restart()
        token = node_task().set(task)
        try:
            return await invoke()
        except GraphInterrupt as exc:
            task.waits += 1
            answers.append(await b.wait(f"interrupt in {what}", _asked(exc),
                                        b.owner.interrupt_timeout_s))
            _resume(config, answers)
        finally:
            node_task().reset(token)


def attempts_blocking(b: Binding, what: str, invoke: Callable[[], Any], config: Any,
                      task: NodeTask) -> Any:
    """``attempts`` for a synchronous task, on the thread LangGraph runs it on."""
    answers: list[Any] = []
    while True:
        task.restart()
        token = node_task().set(task)
        try:
            return invoke()
        except GraphInterrupt as exc:
            task.waits += 1
            wait = b.wait(f"interrupt in {what}", _asked(exc), b.owner.interrupt_timeout_s)
            answers.append(asyncio.run_coroutine_threadsafe(wait, b.loop).result())
            _resume(config, answers)
        finally:
            node_task().reset(token)


# What a node or a task returned, recorded ---------------------------------------------------


@dataclass(frozen=True)
class NodeUpdate:
    """What a node or task returned, handed from the function to the step recording it;
    for a node, where its steps began (``first``), whether it ran alone (no other node's
    steps among its own) and the waits it took: what decides whether a later execution may
    give its update back without running it (``replayed``)."""

    node: str
    update: Any
    first: int = 0
    alone: bool = False
    waits: int = 0


def _exact(update: Any) -> Any:
    """``update`` in LangChain's JSON (``dumpd``) when it loads back equal (plain data,
    messages), else ``None``."""
    try:
        encoded = dumpd(update)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            back = load(encoded, allowed_objects="core")
    except Exception:
        return None
    return encoded if back == update and encoded is not None else None


class NodeStep(EffectFreeStep):
    """``<name>.node.<node>`` (``<name>.task``): one execution of a node (a task), what it
    returned recorded as JSON and published to the run's followers as ``{"node",
    "update"}``. Its requests and effects were the steps it took before. A node's update
    that LangChain's JSON carries exactly is recorded so (``"exact": true``), with where its
    steps began, whether it ran alone and its waits."""

    owner: ClassVar[GraphOwner]
    context = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        done = self.owner.handed(ctx, self.name, args, NodeUpdate)
        shown = jsonable(done.update)
        ctx.emit({"node": done.node, "update": shown})
        exact = _exact(done.update) if done.first else None
        if exact is None:
            return {"update": shown}
        return {"update": exact, "exact": True, "first": done.first, "alone": done.alone,
                "waits": done.waits}


def replayed(b: Binding, step: str, ident: str) -> tuple[bool, Any]:
    """The update an earlier execution recorded for the node ``ident``, when it may be
    given back without running the node: the node ran alone (its steps, from the next one
    to its record, are its own), took no wait, and its update loads back exactly. Then the
    run goes past those steps (``skip_recorded``). Else ``(False, None)``: it runs again,
    its steps' outcomes coming from the log."""
    if not b.ctx.replaying or b.running or b.queue:
        return False, None
    first = b.ctx.step + 1
    at = first
    while (got := b.ctx.recorded(at)) is not None:
        tool, args, result = got
        if tool == step and args == {"task": ident}:
            break
        if tool.startswith(f"{b.owner.name}.node."):  # another node's record
            return False, None
        at += 1
    else:
        return False, None
    if not (isinstance(result, dict) and result.get("exact") and result.get("alone")
            and result.get("first") == first and not result.get("waits")):
        return False, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        update = load(result["update"], allowed_objects="core")
    b.ctx.skip_recorded(at)
    return True, update


# The functional API's tasks -----------------------------------------------------------------


_original: list[Callable[..., Any]] = []


def install() -> None:
    """Make every ``@task`` call a durable task inside a durable run (once per process)."""
    if _original:
        return
    _original.append(_TaskFunction.__call__)

    def call(self: _TaskFunction[Any, Any], *args: Any, **kwargs: Any) -> Any:
        b = bound_run()
        if b is None:
            return _original[0](self, *args, **kwargs)
        clone = copy.copy(self)
        clone.func = _durable_task(b, self.func)
        return _original[0](clone, *args, **kwargs)

    _TaskFunction.__call__ = call  # type: ignore[method-assign]


def _durable_task(b: Binding, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` as one call of a ``@task`` inside the run ``b`` (named where it is called)."""
    caller = node_task().get() or b.task("-")
    name = getattr(func, "__name__", "task")
    place = caller.place()
    ident = f"{caller.ident}>{name}#{place}"
    seen, kept = caller.kept(place, f"task:{name}", ident)
    args = {"task": ident, "name": name}

    async def record(out: Any) -> Any:
        await b.step(b.owner.task_step, args, NodeUpdate(name, out))
        caller.keep(place, f"task:{name}", ident, out)
        b.tasks.pop(ident, None)  # done: its caller keeps its output
        return out

    if asyncio.iscoroutinefunction(func):
        @functools.wraps(func)
        async def run_async(*a: Any, **kw: Any) -> Any:
            if seen:
                return kept
            config = get_config()
            out = await attempts(b, f"task {name!r}", lambda: func(*a, **kw), config,
                                 b.task(ident))
            return await record(out)

        return run_async

    @functools.wraps(func)
    def run(*a: Any, **kw: Any) -> Any:
        if seen:
            return kept
        config = get_config()
        out = attempts_blocking(b, f"task {name!r}", lambda: func(*a, **kw), config,
                                b.task(ident))
        return asyncio.run_coroutine_threadsafe(record(out), b.loop).result()

    return run
