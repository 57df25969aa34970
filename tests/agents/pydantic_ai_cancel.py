"""pydantic-ai agents that end their own runs, for the tests (imported by the workers through
``DURABLE_AGENTS``): tools that call ``RunContext.cancel()`` from inside their step, a plain
one (pydantic-ai runs it on a thread) and an ``async`` one, and a tool that overruns its
deadline and ignores being cancelled. Models are ``FunctionModel``s counting their requests
per idempotency key (``TEST_MODEL_LOG``).
"""

from __future__ import annotations

import asyncio
import time

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import RunContext

from durable.integrations.pydantic_ai import DurableAgent, StepOptions
from tests.agents.pydantic_ai import _count_request, _reply, _returns


def _prompt(messages: list[ModelMessage]) -> str:
    return next(str(p.content) for m in messages if isinstance(m, ModelRequest)
                for p in m.parts if isinstance(p, UserPromptPart))


async def quitting_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Calls the tool the prompt names, then answers (an answer means the run went on)."""
    _count_request()
    if not _returns(messages):
        return _reply(ToolCallPart(_prompt(messages), {}))
    return _reply(TextPart("went on"))


quitter = Agent(FunctionModel(quitting_model), name="pai_stepquit")


@quitter.tool
def give_up(ctx: RunContext[object]) -> str:
    """Stop the whole run (a plain tool: pydantic-ai runs it on a thread)."""
    ctx.cancel()
    return "stopping"


@quitter.tool
async def give_up_async(ctx: RunContext[object]) -> str:
    """Stop the whole run (an ``async`` tool, on the worker's event loop)."""
    ctx.cancel()
    await asyncio.sleep(0)  # where pydantic-ai delivers the cancel
    return "stopping"


@quitter.tool_plain
def stall() -> str:
    """Overrun its deadline, deaf to being cancelled (a thread pydantic-ai waits for)."""
    time.sleep(20)
    return "too late"


DurableAgent(quitter, tools={
    "give_up": StepOptions(timeout_s=5.0, effect_free=True),
    "give_up_async": StepOptions(timeout_s=5.0, effect_free=True),
    "stall": StepOptions(timeout_s=1.0),  # an effect without a lookup: nobody can tell
})
