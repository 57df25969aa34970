"""An agent whose one step streams partial output (``ToolContext.emit``) before it returns;
registered when this module is imported (the tests' ``DURABLE_AGENTS`` names it)."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel

from durable.agents import Agent, Call, Decision, Finish, Lookup, Tool, ToolContext, register
from durable.log.state import RunState


class ChatInput(BaseModel):
    parts: int = 3
    #: Seconds the tool waits after its last emit before it returns.
    pause_s: float = 0.5


@register
class Chatter(Tool):
    """Emits ``parts`` tokens, waits ``pause_s``, returns what it said."""

    name = "chatter"
    timeout_s = 20.0

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        said = []
        for i in range(int(args["parts"])):
            token = f"tok{i}"
            ctx.emit({"token": token})
            said.append(token)
        time.sleep(float(args["pause_s"]))
        return {"said": said}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@register
class Chat(Agent):
    """One streaming step, then finishes with its result."""

    name = "chat"
    input_model = ChatInput
    tools = ("chatter",)

    def decide(self, state: RunState) -> Decision:
        if state.step >= 1:
            assert state.last is not None
            return Finish(state.last.result)
        return Call("chatter", {"parts": state.input["parts"],
                                "pause_s": state.input["pause_s"]})
