"""A durable pydantic-ai run's input: what ``agent.run`` takes, as data (JSON a producer can
send without importing the agent), checked when the run starts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationInfo, field_validator
from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.messages import ModelMessage, UserContent
from pydantic_ai.tools import DeferredToolResults
from pydantic_ai.usage import UsageLimits

_PROMPT: TypeAdapter[list[UserContent]] = TypeAdapter(list[UserContent])
_DEFERRED: TypeAdapter[DeferredToolResults] = TypeAdapter(DeferredToolResults)
_LIMITS: TypeAdapter[UsageLimits] = TypeAdapter(UsageLimits)
#: The fields of ``RunInput`` checked when a run starts, by what reads them.
_CHECKED: dict[str, TypeAdapter[Any]] = {
    "prompt": _PROMPT, "message_history": ModelMessagesTypeAdapter,
    "deferred_tool_results": _DEFERRED, "usage_limits": _LIMITS}


class RunInput(BaseModel):
    """A durable pydantic-ai run's input, each field what ``agent.run`` takes of that name:

    - ``prompt``: text, or a list of user content parts (text, ``image-url``, ``binary``...:
      ``TypeAdapter(list[UserContent]).dump_python(parts, mode="json")``);
    - ``message_history``: the earlier messages
      (``ModelMessagesTypeAdapter.dump_python(messages, mode="json")``);
    - ``deferred_tool_results``: the answers to a run that ended with
      ``DeferredToolRequests`` (``{"approvals": {call id: true}, "calls": {call id: value}}``);
    - ``usage_limits``: pydantic-ai's ``UsageLimits`` fields; none by default (the run's
      budgets bound it, not pydantic-ai's default of 50 requests);
    - ``model``: a model id (``"openai:gpt-4o"``) instead of the agent's;
    - ``metadata``: the run's metadata, as JSON.

    Subclass it to carry what ``deps`` builds the agent's dependencies from."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | list[Any] | None = None
    message_history: list[dict[str, Any]] | None = None
    deferred_tool_results: dict[str, Any] | None = None
    usage_limits: dict[str, Any] | None = None
    model: str | None = None
    metadata: dict[str, Any] | None = None

    @field_validator("prompt", "message_history", "deferred_tool_results", "usage_limits")
    @classmethod
    def _checked(cls, value: Any, info: ValidationInfo) -> Any:
        """Each field as pydantic-ai reads it (a text prompt is any text), kept as JSON."""
        if value is not None and not isinstance(value, str):
            _CHECKED[info.field_name or ""].validate_python(value)
        return value

    def run_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``agent.run`` this input stands for."""
        prompt: Any = self.prompt
        if isinstance(prompt, list):
            prompt = _PROMPT.validate_python(prompt)
        limits = dict(self.usage_limits or {})
        limits.setdefault("request_limit", None)
        out: dict[str, Any] = {
            "user_prompt": prompt,
            "message_history": history(self.message_history),
            "usage_limits": _LIMITS.validate_python(limits),
        }
        if self.deferred_tool_results is not None:
            out["deferred_tool_results"] = _DEFERRED.validate_python(self.deferred_tool_results)
        if self.model is not None:
            out["model"] = self.model
        if self.metadata is not None:
            out["metadata"] = self.metadata
        return out


#: The name of earlier releases.
PromptInput = RunInput


def history(data: list[dict[str, Any]] | None) -> list[ModelMessage] | None:
    return ModelMessagesTypeAdapter.validate_python(data) if data else None


def prompt_input(prompt: str | Sequence[UserContent] | None,
                 message_history: Sequence[ModelMessage] | None = None,
                 **fields: Any) -> dict[str, Any]:
    """A run's input as JSON: ``client.start(name, prompt_input("...", messages))``;
    ``fields`` are the other ``RunInput`` fields (``usage_limits=UsageLimits(...)`` and
    ``deferred_tool_results=DeferredToolResults(...)`` are turned into JSON)."""
    out: dict[str, Any] = {"prompt": prompt if isinstance(prompt, str) or prompt is None
                           else _PROMPT.dump_python(list(prompt), mode="json"), **fields}
    if message_history:
        out["message_history"] = ModelMessagesTypeAdapter.dump_python(list(message_history),
                                                                       mode="json")
    if isinstance(out.get("usage_limits"), UsageLimits):
        out["usage_limits"] = _LIMITS.dump_python(out["usage_limits"], mode="json")
    if isinstance(out.get("deferred_tool_results"), DeferredToolResults):
        out["deferred_tool_results"] = _DEFERRED.dump_python(out["deferred_tool_results"],
                                                             mode="json")
    return out
