"""Code agents of the model-step tests (``tests.test_model_steps``): one ``chat`` step with
the options of the input. Registered on import."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from durable.code import RunContext, agent
from durable.models import chat


class AskInput(BaseModel):
    question: str = "hello"
    stream: bool = False
    #: The call's own timeout and attempts (None: the settings').
    timeout_s: float | None = None
    max_attempts: int | None = None


@agent(input_model=AskInput, tools=("chat",))
def asker(ctx: RunContext, inp: AskInput) -> dict[str, Any]:
    """One model step; returns what the model said."""
    reply = chat(ctx, [{"role": "user", "content": inp.question}], stream=inp.stream,
                 timeout_s=inp.timeout_s, max_attempts=inp.max_attempts)
    return {"answer": reply.content, "usage": reply.usage}
