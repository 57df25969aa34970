"""pydantic-ai agents that use what pydantic-ai's durability base makes durable beyond model
requests and tool calls, for the tests (imported by the workers through ``DURABLE_AGENTS``):
a model whose answer comes after polling a background job (the agent graph's wait between
polls is the engine's durable timer), and a capability with a ``@durable_operation`` method
that records an effect per model request. Models are ``FunctionModel``s counting their
requests per idempotency key (``TEST_MODEL_LOG``); effects go to ``TEST_DB``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability, durable_operation
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import RunContext

from durable.integrations.pydantic_ai import DurableAgent
from tests.agents.pydantic_ai import _count_request, _reply
from tests.servers.integration_world import effect as _effect

#: How long the background job asks to wait before it is polled again, in seconds.
POLL_S = 1.0


async def background_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Submits a job (a response still ``suspended``), and answers once polled."""
    _count_request()
    last = messages[-1]
    if isinstance(last, ModelResponse) and last.state == "suspended":
        return _reply(TextPart("the job is done"))
    return ModelResponse(parts=[], state="suspended", provider_response_id="job-1")


class PollingModel(FunctionModel):
    """A model whose suspended responses are polled after ``POLL_S``."""

    def continuation_delay(self, response: ModelResponse) -> float | None:
        return POLL_S if response.state == "suspended" else None


poller = Agent(PollingModel(background_model), name="pai_poller")
DurableAgent(poller)


@dataclass
class Audit(AbstractCapability[Any]):
    """Records each model request in the outside world, through a durable operation."""

    id: str | None = "audit"

    @durable_operation(name="record")
    async def record(self, ctx: RunContext[Any], what: str) -> str:
        return str(_effect(what)["key"])

    async def before_model_request(self, ctx: RunContext[Any],
                                   request_context: ModelRequestContext
                                   ) -> ModelRequestContext:
        await self.record(ctx, f"request {len(request_context.messages)}")
        return request_context


async def audited_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _count_request()
    return _reply(TextPart("audited"))


audited = Agent(FunctionModel(audited_model), name="pai_audited", capabilities=[Audit()])
DurableAgent(audited)
