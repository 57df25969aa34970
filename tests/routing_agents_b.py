"""One agent of its own for the routing tests (``tests/test_routing.py``): a worker that
loads only this module has agent ``beta`` and no other. Its version is
``TEST_BETA_VERSION`` (default 1), for a rolling deploy."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel

from durable.agents import Agent, Call, Decision, Finish, Lookup, Tool, ToolContext, register
from durable.log.state import RunState


class Steps(BaseModel):
    steps: int = 3
    sleep_s: float = 0.0


@register
class Tick(Tool):
    name = "tick_b"
    effect_free = True

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        if args.get("sleep_s"):
            ctx.token.wait(float(args["sleep_s"]))
        return {"n": args["n"]}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@register
class Routed(Agent):
    name = "beta"
    version = os.environ.get("TEST_BETA_VERSION", "1")
    input_model = Steps
    tools = ("tick_b",)

    def decide(self, state: RunState) -> Decision:
        if state.step >= int(state.input["steps"]):
            return Finish({"steps": state.step, "version": self.version})
        return Call("tick_b", {"n": state.step + 1, "sleep_s": state.input["sleep_s"]})
