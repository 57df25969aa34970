"""The names of a durable pydantic-ai agent's steps are compatibility data: a run's log
records them, and a run recorded under one name is quarantined (nondeterminism) by a worker
that takes the step under another. They are pinned here, whole, as pydantic-ai pins its own
engines' operation names (``tests/durable_exec/test_durable_exec_compat.py``): a change to
this file is a migration of in-flight runs, to be made on purpose.

Also what registration accepts since the integration stands on pydantic-ai's base: the same
toolset instance in two places of one agent is one toolset (it was refused as two toolsets
sharing an id), run for real on a real Redis server in this process.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.capabilities import Toolset
from pydantic_ai.durable_exec import (
    CapabilityOperationId,
    DurableOperationId,
    EventStreamHandlerId,
    ModelCancelSuspendedResponseId,
    ModelCompactMessagesId,
    ModelCountTokensId,
    ModelRequestId,
    ToolsetCallToolId,
    ToolsetGetInstructionsId,
    ToolsetGetToolsId,
    ToolsetValidateToolArgumentsId,
)
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.toolsets import DynamicToolset

from durable.integrations.pydantic_ai import DurableAgent
from durable.integrations.pydantic_ai.backend import StepNamer
from durable.testing import AgentEnvironment
from tests.agents.pydantic_ai import _returns

NAMES: dict[DurableOperationId, str] = {
    ModelRequestId(None, model_name="m"): "a.model",
    ModelRequestId("fast", streaming=True, model_name="m"): "a.model",
    ModelCompactMessagesId(None, model_name="m"): "a.model.compact",
    ModelCountTokensId(None, model_name="m"): "a.model.count_tokens",
    ModelCancelSuspendedResponseId(None, model_name="m"): "a.model.cancel_suspended",
    EventStreamHandlerId(): "a.events",
    CapabilityOperationId("audit", operation="record"): "a.capability",
    ToolsetGetToolsId("mcp", toolset_id="ledger"): "a.mcp.ledger.tools",
    ToolsetGetInstructionsId("ledger"): "a.mcp.ledger.instructions",
    ToolsetCallToolId("mcp", toolset_id="ledger"): "a.mcp.ledger.call",
    ToolsetGetToolsId("dynamic", toolset_id="dyn"): "a.tool.dyn.tools",
    ToolsetValidateToolArgumentsId("dynamic", toolset_id="dyn"): "a.tool.dyn.validate",
}

#: Tool calls' steps: a function tool's named after the tool (the invocation's label).
TOOL_NAMES: dict[tuple[DurableOperationId, str], str] = {
    (ToolsetCallToolId("function", toolset_id="<agent>"), "book"): "a.tool.book",
    (ToolsetCallToolId("function", toolset_id="other"), "book"): "a.tool.other.book",
    (ToolsetCallToolId("dynamic", toolset_id="dyn"), "stamp"): "a.tool.dyn.call",
    (ToolsetValidateToolArgumentsId("function", toolset_id="<agent>"), "book"):
        "a.tool.book.validate",
    (ToolsetValidateToolArgumentsId("function", toolset_id="other"), "book"):
        "a.tool.other.book.validate",
}


def test_every_operations_step_name_is_pinned() -> None:
    namer = StepNamer("a")
    assert {op: namer.invocation_name(op, label=None).operation_name for op in NAMES} == NAMES
    assert {key: namer.invocation_name(key[0], label=key[1]).operation_name
            for key in TOOL_NAMES} == TOOL_NAMES


def _stamp(label: str) -> str:
    """Stamp a label."""
    return f"stamped {label}"


def test_an_agents_registered_step_tools_are_pinned() -> None:
    other = FunctionToolset([_stamp], id="other")
    agent = Agent(TestModel(), name="pai_pinned", toolsets=[
        other, DynamicToolset(lambda ctx: other, id="dyn")])

    @agent.tool_plain
    def book(slot: int) -> int:
        return slot

    made = DurableAgent(agent)
    assert sorted(made.tool_steps) == sorted([
        "pai_pinned.model", "pai_pinned.model.compact", "pai_pinned.model.count_tokens",
        "pai_pinned.model.cancel_suspended", "pai_pinned.events", "pai_pinned.capability",
        "pai_pinned.tool.book", "pai_pinned.tool.book.validate",
        "pai_pinned.tool.other._stamp", "pai_pinned.tool.other._stamp.validate",
        "pai_pinned.tool.dyn.tools", "pai_pinned.tool.dyn.validate", "pai_pinned.tool.dyn.call"])


def _seal(label: str) -> str:
    """Seal a label."""
    return f"sealed {label}"


shared = FunctionToolset([_stamp, _seal], id="twice")


async def _twice_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not _returns(messages):
        return ModelResponse(parts=[ToolCallPart("_stamp", {"label": "x"}),
                                    ToolCallPart("_seal", {"label": "y"})])
    return ModelResponse(parts=[TextPart(", ".join(str(p.content) for p in _returns(messages)))])


# One toolset, two views of it: the agent's (its stamp) and a capability's (its seal).
twice = Agent(FunctionModel(_twice_model), name="pai_one_toolset_twice",
              toolsets=[shared.filtered(lambda ctx, tool: tool.name == "_stamp")],
              capabilities=[Toolset(shared.filtered(lambda ctx, tool: tool.name == "_seal"))])
DurableAgent(twice)


def test_the_same_toolset_in_two_places_is_one_toolset(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Any) -> None:
    """The agent's toolsets and a capability each hold a view of one ``FunctionToolset``
    instance: one toolset, each call of its tools a step (it was refused: "two toolsets
    have the id")."""
    monkeypatch.setenv("TEST_MODEL_LOG", str(tmp_path / "model.sqlite"))
    with AgentEnvironment("tests.test_pydantic_ai_names") as env:
        final = env.execute("pai_one_toolset_twice", {"prompt": "go"}, run_id="twice")
        assert final.state == "completed", (final.state, final.error)
        assert final.result == "stamped x, sealed y"
        assert [a.tool for a in final.actions.values()] == [
            "pai_one_toolset_twice.model", "pai_one_toolset_twice.tool.twice._stamp",
            "pai_one_toolset_twice.tool.twice._seal", "pai_one_toolset_twice.model"]
