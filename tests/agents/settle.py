"""Agents and tools of the settle and cancel tests (worker processes import this module
through ``DURABLE_AGENTS``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from durable.agents import Agent, Call, Decision, Finish, Tool, ToolContext, register
from durable.log.state import RunState


@register
class Peek(Tool):
    """A read with no ``lookup`` (the base class's: it cannot tell). Its first call hangs
    past its deadline (the worker stops it: outcome unknown); later calls answer. Each
    call is counted in the file ``TEST_PEEK_FILE``."""

    name = "peek"
    timeout_s = 0.5

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        path = Path(os.environ["TEST_PEEK_FILE"])
        calls = int(path.read_text() or 0) + 1 if path.exists() else 1
        path.write_text(str(calls))
        if calls == 1:
            end = time.time() + 30
            while time.time() < end:
                ctx.check()
                time.sleep(0.01)
        return {"q": args.get("q"), "call": calls}


class PeekInput(BaseModel):
    q: str = "x"


@register
class Peeker(Agent):
    """One ``peek``, then finish with its result."""

    name = "peeker"
    input_model = PeekInput
    tools = ("peek",)

    def decide(self, state: RunState) -> Decision:
        last = state.last
        if last is None:
            return Call("peek", {"q": state.input["q"]})
        return Finish(last.result)


class Empty(BaseModel):
    pass


@register
class HangAfter(Agent):
    """Takes one step, then its ``decide`` never returns (a bug in agent code)."""

    name = "hangafter"
    input_model = Empty
    tools = ("noop",)

    def decide(self, state: RunState) -> Decision:
        if state.step >= 1:
            while True:
                time.sleep(0.05)
        return Call("noop", {"n": 1})
