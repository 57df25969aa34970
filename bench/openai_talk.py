"""The OpenAI Agents SDK agent of ``bench.conversation``: the same 100-call conversation as
``bench.framework_agents``' ``pai_talk``, as an unchanged SDK ``Agent`` made durable
(``durable.integrations.openai_agents``, the agent ``oai_talk``).

Its model is an SDK ``Model`` in this process that answers at once (as pydantic-ai's
``FunctionModel`` does for ``pai_talk``): ``TALK_CALLS`` requests, each reply some text and a
call of the effect-free ``look`` tool until the last, ~1 KB of conversation a call. No
network: what is measured is the integration and the worker, not a provider.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, ModelSettings, Runner, Tool, function_tool
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelProvider, ModelTracing
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from bench.framework_agents import TALK_CALLS, WORDS
from durable.integrations.openai_agents import DurableAgent, StepOptions

__all__ = ["TALK_CALLS", "plain_run", "talker"]

# The SDK's tracing would export to OpenAI (and spend the CPU measured here on it).
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")


def _calls_done(input: str | list[TResponseInputItem]) -> int:
    if isinstance(input, str):
        return 0
    return sum(1 for item in input if isinstance(item, dict)
               and item.get("type") == "function_call_output")


def _text(text: str, n: int) -> ResponseOutputMessage:
    return ResponseOutputMessage(id=f"msg_{n}", type="message", role="assistant",
                                 status="completed", content=[ResponseOutputText(
                                     type="output_text", text=text, annotations=[])])


class TalkingModel(Model):
    """Answers at once: text and a ``look`` call until ``TALK_CALLS`` requests were made."""

    async def get_response(self, system_instructions: str | None,
                           input: str | list[TResponseInputItem],
                           model_settings: ModelSettings, tools: list[Tool], output_schema: Any,
                           handoffs: list[Any], tracing: ModelTracing, *,
                           previous_response_id: str | None, conversation_id: str | None,
                           prompt: Any) -> ModelResponse:
        done = _calls_done(input)
        usage = Usage(requests=1, input_tokens=5, output_tokens=2, total_tokens=7)
        if done < TALK_CALLS - 1:
            output: list[Any] = [_text(WORDS, done), ResponseFunctionToolCall(
                type="function_call", call_id=f"call_{done}", name="look",
                arguments=f'{{"n": {done + 1}}}', id=f"fc_{done}", status="completed")]
        else:
            output = [_text(f"looked {done} times", done)]
        return ModelResponse(output=output, usage=usage, response_id=None)

    def stream_response(self, system_instructions: str | None,
                        input: str | list[TResponseInputItem], model_settings: ModelSettings,
                        tools: list[Tool], output_schema: Any, handoffs: list[Any],
                        tracing: ModelTracing, *, previous_response_id: str | None,
                        conversation_id: str | None,
                        prompt: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the bench's model does not stream")


class TalkingProvider(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        return TalkingModel()


@function_tool
def look(n: int) -> dict[str, Any]:
    """Look something up (effect-free): a result of ~0.5 KB."""
    return {"n": n, "found": WORDS[:200] + str(n)}


agent = Agent(name="talker", instructions="Look things up.", model="talking", tools=[look])
talker = DurableAgent(agent, name="oai_talk", model_provider=TalkingProvider(),
                      tools={"look": StepOptions(effect_free=True)}, stream=False)


async def plain_run(model: Model) -> Any:
    """The same conversation run plainly by the SDK in this process, on ``model``."""
    return await Runner.run(agent.clone(model=model), "go", max_turns=TALK_CALLS + 5)
