"""An agent whose one step streams partial output (``ToolContext.emit``) before it returns;
registered when this module is imported (the tests' ``DURABLE_AGENTS`` names it)."""

from __future__ import annotations

import os
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


def _gate(path: str, timeout_s: float = 15.0) -> None:
    """Wait until the test creates the file ``path`` (a gate it opens)."""
    end = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"gate {path} never opened")
        time.sleep(0.02)


@register
class GatedChatter(Tool):
    """Emits ``first`` tokens, waits for the gate file ``<gate>.1``, emits the rest of
    ``parts``, waits for ``<gate>.2``, returns what it said: a test decides when each part
    of its output is said, and when the call ends."""

    name = "gated_chatter"
    timeout_s = 30.0

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        said = []
        for i in range(int(args["parts"])):
            if i == int(args["first"]):
                _gate(f"{args['gate']}.1")
            token = f"tok{i}"
            ctx.emit({"token": token})
            said.append(token)
        _gate(f"{args['gate']}.2")
        return {"said": said}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


class GatedInput(BaseModel):
    parts: int = 6
    first: int = 3
    gate: str


@register
class GatedChat(Agent):
    """One gated streaming step, then a second plain one, then finishes."""

    name = "gated_chat"
    input_model = GatedInput
    tools = ("gated_chatter", "noop")

    def decide(self, state: RunState) -> Decision:
        if state.step == 0:
            return Call("gated_chatter", dict(state.input))
        if state.step == 1:
            return Call("noop", {"n": 1})
        assert state.last is not None
        return Finish({"steps": state.step})
