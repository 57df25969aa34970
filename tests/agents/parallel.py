"""Agents that take several steps at once, in each style (registered on import;
``tests.agents.basic`` imports this module): a sync code agent (``ctx.parallel``), an async one
(``asyncio.gather``) and a ``decide()`` agent returning a list of calls."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pydantic import BaseModel

from durable.agents import Agent, Call, Decision, Finish, Lookup, Tool, ToolContext, register
from durable.code import RunContext, StepFailed, agent
from durable.log.state import RunState


class FanInput(BaseModel):
    calls: int = 3
    tool: str = "sqlwrite"
    sleep_s: float = 0.0


def _args(inp: FanInput, n: int) -> dict[str, Any]:
    return {"n": n, "sleep_s": inp.sleep_s} if inp.tool == "noop" else {"n": n}


@agent(input_model=FanInput, tools=("sqlwrite", "noop"))
def fan_out(ctx: RunContext, inp: FanInput) -> dict[str, Any]:
    """Its calls at once, then one more step after them."""
    results = ctx.parallel([(inp.tool, _args(inp, n)) for n in range(1, inp.calls + 1)])
    after = ctx.call("noop", {"n": 0})
    return {"results": results, "after": after}


@agent(input_model=FanInput, tools=("sqlwrite", "noop"))
async def async_fan_out(ctx: Any, inp: FanInput) -> dict[str, Any]:
    results = await asyncio.gather(*(ctx.call(inp.tool, _args(inp, n))
                                     for n in range(1, inp.calls + 1)))
    after = await ctx.call("noop", {"n": 0})
    return {"results": list(results), "after": after}


@register
class FanOut(Agent):
    """A ``decide()`` agent: its first decision is every call at once."""

    name = "decide_fan_out"
    input_model = FanInput
    tools = ("sqlwrite", "noop")

    def decide(self, state: RunState) -> Decision | list[Call]:
        inp = FanInput.model_validate(state.input)
        if state.step == 0:
            return [Call(inp.tool, _args(inp, n)) for n in range(1, inp.calls + 1)]
        return Finish({"results": [state.actions[n].result for n in range(1, inp.calls + 1)]})


@register
class Failing(Tool):
    """An API that refuses every call (a conclusive failure: nothing was applied)."""

    name = "failing"
    timeout_s = 5.0

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        raise ValueError("refused by the API")

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@agent(tools=("sqlwrite", "failing"))
def partly_failing(ctx: RunContext, inp: Any) -> dict[str, Any]:
    """One call of three fails: the others' outcomes are kept and handed back."""
    got = ctx.parallel([("sqlwrite", {"n": 1}), ("failing", {}), ("sqlwrite", {"n": 3})],
                       return_exceptions=True)
    try:
        ctx.parallel([("sqlwrite", {"n": 4}), ("failing", {})])
    except StepFailed as exc:
        return {"first": [type(g).__name__ for g in got], "failed_step": exc.step,
                "outcomes": [type(o).__name__ for o in exc.outcomes or []]}
    return {"first": [type(g).__name__ for g in got]}


@agent(tools=("noop",), max_parallel=2)
def too_wide(ctx: RunContext, inp: Any) -> Any:
    return ctx.parallel([("noop", {"n": n}) for n in range(3)])


@agent(tools=("noop",))
def from_a_thread(ctx: RunContext, inp: Any) -> Any:
    """Calls ``ctx.call`` from a thread of its own: refused, with the rule."""
    errors: list[BaseException] = []

    def other() -> None:
        try:
            ctx.call("noop", {"n": 1})
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    raise errors[0]


@agent(tools=("noop",))
def uneven(ctx: RunContext, inp: Any) -> list[Any]:
    """A quick call and a slow one (3 s) at once."""
    return ctx.parallel([("noop", {"n": 1}), ("noop", {"n": 2, "sleep_s": 3.0})])
