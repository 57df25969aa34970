"""``async def`` code agents and tools used by the tests of the worker's event loop
(registered on import; ``tests.agents.basic`` imports this module)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import BaseModel

from durable.agents import ToolContext, register
from durable.code import AsyncRunContext, agent
from tests.agents.basic import SqlWrite
from tests.agents.code import StepsInput


@register
class AsyncSqlWrite(SqlWrite):
    """``sqlwrite`` as an ``async def`` tool: the row is written by a thread of the loop's
    executor (SQLite has no async driver), the call awaited on the worker's event loop."""

    name = "asyncsqlwrite"

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await asyncio.to_thread(SqlWrite.run, self, args, ctx)


@register
class AsyncSlowWrite(SqlWrite):
    """``sqlwrite`` as an ``async def`` tool that cannot be cancelled: it awaits
    ``sleep_s`` on the loop, then writes its row."""

    name = "asyncslowwrite"
    timeout_s = 30.0

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        await asyncio.sleep(float(args.get("sleep_s", 0)))
        return await asyncio.to_thread(SqlWrite.run, self, args, ctx)


@agent(input_model=StepsInput, tools=("asyncsqlwrite",))
async def async_writer(ctx: AsyncRunContext, inp: StepsInput) -> dict[str, Any]:
    """Writes ``steps`` rows, keeping what it wrote in a local list."""
    rows = []
    for n in range(1, inp.steps + 1):
        rows.append((await ctx.call("asyncsqlwrite", {"n": n}))["row"])
    return {"rows": rows}


class HoldInput(BaseModel):
    steps: int = 1
    sleep_s: float = 1.0
    #: Seconds the function blocks the event loop first (``time.sleep``: a bug).
    block_s: float = 0.0


@agent(input_model=HoldInput, tools=("asyncsleep",))
async def async_holder(ctx: AsyncRunContext, inp: HoldInput) -> int:
    """Awaits an ``async def`` tool ``steps`` times, each call ``sleep_s`` long."""
    if inp.block_s and not ctx.replaying:
        time.sleep(inp.block_s)
    for n in range(inp.steps):
        await ctx.call("asyncsleep", {"sleep_s": inp.sleep_s, "n": n})
    return inp.steps


@agent(input_model=HoldInput, tools=("asyncslowwrite",))
async def async_slow_writer(ctx: AsyncRunContext, inp: HoldInput) -> int:
    """Awaits the tool that cannot be cancelled ``steps`` times, each call ``sleep_s``."""
    for n in range(inp.steps):
        await ctx.call("asyncslowwrite", {"n": n, "sleep_s": inp.sleep_s})
    return inp.steps


@agent(input_model=StepsInput, tools=("asyncsqlwrite",))
async def async_skipper(ctx: AsyncRunContext, inp: StepsInput) -> int:
    """Writes one row, then asks to go past ``steps`` steps it never took: refused."""
    await ctx.call("asyncsqlwrite", {"n": 1})
    ctx.skip_recorded(inp.steps)
    return ctx.step


@agent(input_model=HoldInput, tools=("asyncslowwrite",))
async def async_impatient(ctx: AsyncRunContext, inp: HoldInput) -> str:
    """Stops awaiting its one call after 0.2 s and returns while the call is in flight."""
    try:
        await asyncio.wait_for(ctx.call("asyncslowwrite", {"n": 1, "sleep_s": inp.sleep_s}),
                               0.2)
    except TimeoutError:
        return "gave up waiting"
    return "waited"
