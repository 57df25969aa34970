"""The agents of ``bench.styles``: the same run (``steps`` calls of a tool that waits
``sleep_s``) written in each agent style -- an ``async def`` code agent awaiting an
``async def`` tool, a plain code agent calling a plain tool, and ``decide()`` agents (the
examples' ``count``, whose ``noop`` tool is plain, and ``count_async`` with the async
tool)."""

from __future__ import annotations

import asyncio
from typing import Any

from durable.agents import Agent, Call, Decision, Finish, Lookup, Tool, ToolContext, register
from durable.code import AsyncRunContext, RunContext, agent
from durable.log.state import RunState
from examples.agents.basic import CountInput


@register
class AsyncNoop(Tool):
    """``noop`` as an ``async def`` tool: it awaits ``sleep_s`` on the worker's event loop."""

    name = "async_noop"
    timeout_s = 10.0
    cancellable = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        sleep = float(args.get("sleep_s", 0))
        if sleep:
            await asyncio.sleep(sleep)
        return {"n": args.get("n")}

    async def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@agent(input_model=CountInput, tools=("async_noop",))
async def async_count(ctx: AsyncRunContext, inp: CountInput) -> dict[str, int]:
    for n in range(1, inp.steps + 1):
        await ctx.call("async_noop", {"n": n, "sleep_s": inp.sleep_s})
    return {"steps": inp.steps}


@agent(input_model=CountInput, tools=("noop",))
def sync_count(ctx: RunContext, inp: CountInput) -> dict[str, int]:
    for n in range(1, inp.steps + 1):
        ctx.call("noop", {"n": n, "sleep_s": inp.sleep_s})
    return {"steps": inp.steps}


@register
class CountAsync(Agent):
    """The examples' ``count`` with the ``async def`` tool."""

    name = "count_async"
    input_model = CountInput
    tools = ("async_noop",)

    def decide(self, state: RunState) -> Decision:
        if state.step >= int(state.input["steps"]):
            return Finish({"steps": state.step})
        return Call("async_noop", {"n": state.step + 1,
                                   "sleep_s": state.input.get("sleep_s", 0)})
