"""Agents that delegate to child runs (registered on import; ``tests.agents.basic`` imports this
module): a parent starting several children and joining them, children that write a row
in the test database, one that fails, and a detached one."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from durable.code import ChildFailed, RunContext, agent


class ParentInput(BaseModel):
    children: int = 2
    sleep_s: float = 0.0
    detached: bool = False


@agent(input_model=ParentInput, tools=("noop",))
def parent(ctx: RunContext, inp: ParentInput) -> dict[str, Any]:
    """Starts its children (they run at once), then joins each."""
    kids = [ctx.start_child("kid", {"n": n, "sleep_s": inp.sleep_s})
            for n in range(1, inp.children + 1)]
    if inp.detached:
        ctx.start_child("kid", {"n": 99, "sleep_s": inp.sleep_s}, detached=True)
    return {"results": [ctx.join(k) for k in kids], "children": [k.run_id for k in kids]}


class KidInput(BaseModel):
    n: int
    sleep_s: float = 0.0


@agent(input_model=KidInput, tools=("sqlwrite", "noop"))
def kid(ctx: RunContext, inp: KidInput) -> dict[str, Any]:
    if inp.sleep_s:
        ctx.call("noop", {"n": 0, "sleep_s": inp.sleep_s})
    return {"n": inp.n, "row": ctx.call("sqlwrite", {"n": inp.n})["row"]}


@agent(tools=("failing",))
def failing_kid(ctx: RunContext, inp: Any) -> None:
    ctx.call("failing", {})  # its StepFailed, not caught, fails the run


@agent(tools=())
def parent_of_failure(ctx: RunContext, inp: Any) -> dict[str, Any]:
    try:
        ctx.child("failing_kid", {})
    except ChildFailed as exc:
        return {"child": exc.child, "state": exc.status, "error": exc.error}
    return {"child": None}


@agent(tools=())
async def async_parent(ctx: Any, inp: Any) -> list[Any]:
    return [await ctx.child("kid", {"n": 1}), await ctx.child("kid", {"n": 2})]


class ThinkInput(BaseModel):
    calls: int


@agent(input_model=ThinkInput, tools=("echo_model",))
def thinker(ctx: RunContext, inp: ThinkInput) -> int:
    """A sub-agent that makes ``calls`` model calls (10 tokens each)."""
    for n in range(inp.calls):
        ctx.call("echo_model", {"messages": [{"role": "user", "content": f"q{n}"}]})
    return inp.calls


class SharingInput(BaseModel):
    before: int = 2
    child_calls: int = 3


@agent(input_model=SharingInput, tools=("echo_model",),
       budgets={"model_calls": 6, "tokens": 1000})
def budget_parent(ctx: RunContext, inp: SharingInput) -> dict[str, Any]:
    """Model calls of its own, a child sharing its budgets, then calls until its budget
    ends the run."""
    for n in range(inp.before):
        ctx.call("echo_model", {"messages": [{"role": "user", "content": f"p{n}"}]})
    try:
        got = ctx.child("thinker", {"calls": inp.child_calls}, share_budgets=True)
    except ChildFailed as exc:
        got = exc.status
    for n in range(20):
        ctx.call("echo_model", {"messages": [{"role": "user", "content": f"after{n}"}]})
    return {"child": got}


@agent(tools=())
def asking_kid(ctx: RunContext, inp: Any) -> Any:
    """Waits an hour for an answer (``durable respond``), and returns it."""
    return ctx.wait("input", "which one?", 3600.0)


@agent(tools=())
def parent_of_asker(ctx: RunContext, inp: Any) -> Any:
    """Joins a child that waits for input, for up to a day."""
    return ctx.child("asking_kid", {}, timeout_s=86400.0)


@agent(tools=())
def raising_kid(ctx: RunContext, inp: Any) -> None:
    raise RuntimeError("a bug in the child's code")  # quarantined: not an ending


@agent(tools=())
def parent_of_raiser(ctx: RunContext, inp: Any) -> Any:
    """Waits for a child that is quarantined (the default policy: it keeps waiting)."""
    return ctx.child("raising_kid", {}, timeout_s=86400.0)


@agent(tools=(), on_child_quarantined="fail")
def failing_parent_of_raiser(ctx: RunContext, inp: Any) -> dict[str, Any]:
    """Told of its child's quarantine as a child that did not complete."""
    try:
        ctx.child("raising_kid", {}, timeout_s=86400.0)
    except ChildFailed as exc:
        return {"child": exc.child, "state": exc.status, "error": exc.error}
    return {"child": None}


@agent(tools=(), on_child_quarantined="cancel")
def canceling_parent_of_raiser(ctx: RunContext, inp: Any) -> Any:
    """Canceled when its child is quarantined."""
    return ctx.child("raising_kid", {}, timeout_s=86400.0)
