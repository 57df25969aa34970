"""The agents of the routing tests (``tests/test_routing.py``), one module each
(``tests.agents.routing_alpha``, ``tests.agents.routing_beta``): a worker that loads one has that
agent and no other. ``define`` makes an agent with a tool of its own; its version is
``TEST_<NAME>_VERSION`` (default 1) and how it takes over runs of another version
``TEST_<NAME>_POLICY`` (default ``continue``), read when the module is imported."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel

from durable.agents import Agent, Call, Decision, Finish, Lookup, Tool, ToolContext, register
from durable.log.state import RunState


class Steps(BaseModel):
    steps: int = 3
    sleep_s: float = 0.0


def define(agent_name: str, tool_name: str) -> None:
    """Register ``agent_name``, which takes ``steps`` calls of the effect-free
    ``tool_name`` (each sleeping ``sleep_s``) and finishes with its version."""

    class Tick(Tool):
        name = tool_name
        effect_free = True

        def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
            if args.get("sleep_s"):
                ctx.token.wait(float(args["sleep_s"]))
            return {"n": args["n"]}

        def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
            return Lookup.not_applied()

    env = agent_name.upper()

    class Routed(Agent):
        name = agent_name
        version = os.environ.get(f"TEST_{env}_VERSION", "1")
        on_version_change = os.environ.get(f"TEST_{env}_POLICY",  # type: ignore[assignment]
                                           "continue")
        input_model = Steps
        tools = (tool_name,)

        def decide(self, state: RunState) -> Decision:
            if state.step >= int(state.input["steps"]):
                return Finish({"steps": state.step, "version": self.version})
            return Call(tool_name, {"n": state.step + 1, "sleep_s": state.input["sleep_s"]})

    register(Tick)
    register(Routed)
