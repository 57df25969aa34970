"""pydantic-ai agents in the shapes pydantic-ai's own durable-execution tests give their
Temporal, DBOS and Prefect integrations (imported by the workers through ``DURABLE_AGENTS``):
a tool return and a model response over the inline limit, one toolset instance shared by two
agents, a second model that a run chooses by its name, and a toolset a capability of the
user's own contributes. Models are ``FunctionModel``s
counting their requests per idempotency key (``TEST_MODEL_LOG``); tools write their effects
into ``TEST_DB``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from durable.agents import Lookup
from durable.integrations.pydantic_ai import DurableAgent, StepOptions
from tests.agents.pydantic_ai import _count_request, _done, _reply, _returns
from tests.servers.integration_world import applied
from tests.servers.integration_world import effect as _effect

#: The size of the large values below, in bytes: over the inline limit the tests set
#: (``DURABLE_MAX_PAYLOAD_BYTES``), under the ceiling (``DURABLE_MAX_RESULT_BYTES``).
BIG = 6000


# Large values: a tool whose returns (two calls of one reply, a parallel group), and a model
# whose final response, are over the inline limit (kept beside the run by reference,
# ``durable.log.blobs``).


async def big_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _count_request()
    done = _returns(messages)
    if not done:
        return _reply(ToolCallPart("fetch_page", {"page": 1}),
                      ToolCallPart("fetch_page", {"page": 2}))
    read = sum(len(p.content["text"]) for p in done if isinstance(p.content, dict))
    return _reply(TextPart(f"read {read}: " + "z" * BIG))


big_agent = Agent(FunctionModel(big_model), name="pai_big")


@big_agent.tool_plain
def fetch_page(page: int) -> dict[str, Any]:
    """Fetch a large page (an effect, keyed: a fetch made twice would show)."""
    return {**_effect(f"page {page}"), "text": "y" * BIG}


def _fetched(key: str, args: dict[str, Any]) -> Lookup:
    return Lookup.applied({"done": f"page {args['page']}", "key": key, "text": "y" * BIG}) \
        if applied(key) else Lookup.not_applied()


DurableAgent(big_agent, tools={"fetch_page": StepOptions(timeout_s=5.0, lookup=_fetched)})


# One toolset instance, given to two agents (pydantic-ai's peers wrap it per agent, leaving
# the instance as it was): each agent's calls are its own steps.


def shared_stamp(label: str) -> dict[str, Any]:
    """Stamp a label (an effect)."""
    return _effect(f"stamp {label}")


shared_toolset = FunctionToolset([shared_stamp], id="shared")


def _sharing_model(label: str) -> FunctionModel:
    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        _count_request()
        done = _returns(messages)
        if not done:
            return _reply(ToolCallPart("shared_stamp", {"label": label}))
        return _reply(TextPart(f"{label}: {_done(done[0])}"))

    return FunctionModel(model)


share_a = Agent(_sharing_model("a"), name="pai_share_a", toolsets=[shared_toolset])
share_b = Agent(_sharing_model("b"), name="pai_share_b", toolsets=[shared_toolset])
DurableAgent(share_a, tools={"shared.shared_stamp": StepOptions(timeout_s=5.0)})
DurableAgent(share_b, tools={"shared.shared_stamp": StepOptions(timeout_s=5.0)})


# A model chosen per run: the agent's own, or one registered under a name (``models=``) that
# a run's input names; pydantic-ai's peers take the same ``models=`` mapping.


def _answering_model(who: str) -> FunctionModel:
    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        _count_request()
        done = _returns(messages)
        if not done:
            return _reply(ToolCallPart("mark", {"by": who}))
        return _reply(TextPart(f"{who} after {_done(done[0])}"))

    model.__name__ = f"{who}_model"
    return FunctionModel(model)


chooser = Agent(_answering_model("primary"), name="pai_chooser")


@chooser.tool_plain
def mark(by: str) -> dict[str, Any]:
    """Mark who asked (an effect)."""
    return _effect(f"mark {by}")


def _marked(key: str, args: dict[str, Any]) -> Lookup:
    return Lookup.applied({"done": f"mark {args['by']}", "key": key}) if applied(key) \
        else Lookup.not_applied()


DurableAgent(chooser, models={"second": _answering_model("second")},
             tools={"mark": StepOptions(timeout_s=5.0, lookup=_marked)})


# A toolset a capability of the user's own contributes (``get_toolset``, the same instance
# each time: pydantic-ai's base makes it durable once, when the agent is built): its calls
# are steps like the agent's own tools.


def seal(label: str) -> dict[str, Any]:
    """Seal a label (an effect)."""
    return _effect(f"seal {label}")


@dataclass
class Sealing(AbstractCapability[Any]):
    """Contributes the ``seals`` toolset (``anew``: a new instance each time it is asked)."""

    anew: bool = False
    toolset: FunctionToolset[Any] = field(
        default_factory=lambda: FunctionToolset([seal], id="seals"))

    def get_toolset(self) -> FunctionToolset[Any]:
        return FunctionToolset([seal], id="seals") if self.anew else self.toolset


async def sealing_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _count_request()
    done = _returns(messages)
    if not done:
        return _reply(ToolCallPart("seal", {"label": "a"}))
    return _reply(TextPart(f"sealed: {_done(done[0])}"))


def _sealed(key: str, args: dict[str, Any]) -> Lookup:
    return Lookup.applied({"done": f"seal {args['label']}", "key": key}) if applied(key) \
        else Lookup.not_applied()


sealer = Agent(FunctionModel(sealing_model), name="pai_sealer", capabilities=[Sealing()])
DurableAgent(sealer, tools={"seals.seal": StepOptions(timeout_s=5.0, lookup=_sealed)})
