"""A long OpenAI Agents SDK conversation run as a durable run, for the cost test
(``tests.test_request_digest_cost``): ``CHAT_CALLS`` model requests, each reply some text and a
call of an effect-free lookup until the last, each tool result ~0.3 KB. The model is scripted
in process behind the SDK's ``Model`` interface (as pydantic-ai's ``FunctionModel`` is), not
streamed: the step's cost is what is measured, not a server's.
"""

from __future__ import annotations

import json
from typing import Any

from agents import Agent, ModelResponse, Usage, function_tool
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from durable.integrations.openai_agents import DurableAgent, StepOptions

#: Model requests the conversation makes.
CHAT_CALLS = 100
_SAID = "a reply says something beside its tool call, as real ones do. " * 4


def _said(n: int, text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id=f"msg_{n}", type="message", role="assistant",
                                 status="completed", content=[ResponseOutputText(
                                     type="output_text", text=text, annotations=[])])


class ChattyModel(Model):
    """Replies with text and a ``look_up`` call until ``CHAT_CALLS`` requests, then answers."""

    async def get_response(self, system_instructions: str | None, input: Any,
                           model_settings: Any, tools: Any, output_schema: Any, handoffs: Any,
                           tracing: Any, **extra: Any) -> ModelResponse:
        done = sum(1 for item in input if isinstance(item, dict)
                   and item.get("type") == "function_call_output") \
            if isinstance(input, list) else 0
        output: list[Any] = [_said(done, _SAID if done < CHAT_CALLS - 1
                                   else f"looked up {done} times")]
        if done < CHAT_CALLS - 1:
            output.append(ResponseFunctionToolCall(
                type="function_call", call_id=f"call_{done}", name="look_up",
                arguments=json.dumps({"n": done + 1}), id=f"fc_{done}", status="completed"))
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("this model does not stream")


@function_tool
def look_up(n: int) -> dict[str, Any]:
    """Look something up (effect-free)."""
    return {"n": n, "found": _SAID[:200]}


chatty = Agent(name="chatty", instructions="look things up.", model=ChattyModel(),
               tools=[look_up])
durable_chatty = DurableAgent(chatty, name="oai_chat", stream=False, max_turns=CHAT_CALLS + 5,
                              tools={"look_up": StepOptions(effect_free=True)})
