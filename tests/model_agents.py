"""Code agents of the model-step tests (``tests.test_model_steps``): one ``chat`` step with
the options of the input, and a conversation continued from run to run
(``durable.conversations``). Registered on import."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from durable import conversations
from durable.code import RunContext, agent
from durable.models import chat


class AskInput(BaseModel):
    question: str = "hello"
    stream: bool = False
    #: The call's own timeout and attempts (None: the settings').
    timeout_s: float | None = None
    max_attempts: int | None = None


@agent(input_model=AskInput, tools=("chat",))
def model_asker(ctx: RunContext, inp: AskInput) -> dict[str, Any]:
    """One model step; returns what the model said."""
    reply = chat(ctx, [{"role": "user", "content": inp.question}], stream=inp.stream,
                 timeout_s=inp.timeout_s, max_attempts=inp.max_attempts)
    return {"answer": reply.content, "usage": reply.usage}


class TurnInput(BaseModel):
    #: What the user says this turn; ``pad`` characters of filler make the history large.
    say: str
    pad: int = 0


@agent(input_model=TurnInput, tools=("chat", *conversations.TOOLS))
def talker(ctx: RunContext, inp: TurnInput) -> dict[str, Any]:
    """One turn of a conversation that goes on from run to run: the history of the run it
    continues, the user's words, the model's answer; the whole conversation kept for the
    next run."""
    messages = conversations.load(ctx)
    messages.append({"role": "user", "content": inp.say + " " + "x" * inp.pad})
    reply = chat(ctx, messages)
    messages.append(reply.message)
    saved = conversations.save(ctx, messages)
    return {"turns": sum(1 for m in messages if m["role"] == "user"), "bytes": saved}
