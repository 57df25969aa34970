"""The base the framework integrations share (``durable.integrations.base``): one
``StepOptions`` with one default, one ``step_context``, and imports that go one way (no
cycle inside ``durable/integrations``, type-only imports counted)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from durable.agents import ToolContext
from durable.agents.cancel_token import CancelToken
from durable.integrations import base

INTEGRATIONS = Path(__file__).resolve().parent.parent / "durable" / "integrations"


def test_both_integrations_export_the_one_step_options_and_step_context() -> None:
    pytest.importorskip("pydantic_ai")
    pytest.importorskip("agents")
    from durable.integrations import openai_agents, pydantic_ai

    assert pydantic_ai.StepOptions is openai_agents.StepOptions is base.StepOptions
    assert pydantic_ai.step_context is openai_agents.step_context is base.step_context


def test_a_step_timeout_is_the_options_else_the_tools_own_else_sixty_seconds() -> None:
    assert base.StepOptions().timeout_s is None
    assert base.StepOptions().timeout() == base.DEFAULT_TIMEOUT_S == 60.0
    assert base.StepOptions().timeout(declared=7.0) == 7.0
    assert base.StepOptions(timeout_s=2.0).timeout(declared=7.0) == 2.0
    attrs = base.StepOptions(effect_free=True).step_attrs(declared=None)
    assert attrs["timeout_s"] == 60.0 and attrs["effect_free"] is True


def test_an_openai_agents_tool_keeps_its_own_timeout_and_refuses_step_false() -> None:
    pytest.importorskip("agents")
    from agents import Agent, function_tool

    from durable.agents import registry
    from durable.integrations.openai_agents import DurableAgent, StepOptions

    @function_tool(timeout=7.0)
    async def slow_read(order: str) -> str:
        return order

    @function_tool
    def plain_read(order: str) -> str:
        return order

    agent = Agent(name="base_timeouts", tools=[slow_read, plain_read], model="gpt-4o")
    DurableAgent(agent, name="base_timeouts")
    assert registry.tools["base_timeouts.tool.slow_read"].timeout_s == 7.0
    assert registry.tools["base_timeouts.tool.plain_read"].timeout_s == 60.0
    with pytest.raises(ValueError, match="step=False"):
        DurableAgent(Agent(name="base_no_step", tools=[plain_read], model="gpt-4o"),
                     tools={"plain_read": StepOptions(step=False)})


def test_a_pydantic_ai_tool_step_takes_sixty_seconds_by_default() -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    from durable.agents import registry
    from durable.integrations.pydantic_ai import DurableAgent, StepOptions

    agent = Agent(TestModel(), name="base_pai_timeouts")

    @agent.tool_plain(timeout=7.0)
    def read(order: str) -> str:
        return order

    @agent.tool_plain
    def write(order: str) -> str:
        return order

    DurableAgent(agent, tools={"write": StepOptions(timeout_s=3.0)})
    assert registry.tools["base_pai_timeouts.tool.read"].timeout_s == 60.0
    assert registry.tools["base_pai_timeouts.tool.write"].timeout_s == 3.0


def test_step_context_outside_a_step_and_a_missing_live_request_say_so() -> None:
    with pytest.raises(LookupError):
        base.step_context()
    ctx = ToolContext(run_id="r", step=3, key="r:3", deadline_ms=0, token=CancelToken())
    live = base.LiveRequests()
    with live.handing(("r", 3), "request"):
        assert live.take(("r", 3), str, ctx, "a.model") == "request"
    assert len(live) == 0
    with pytest.raises(RuntimeError, match=r"a\.model"):
        live.take(("r", 3), str, ctx, "a.model")


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports, ``TYPE_CHECKING`` blocks included
    (``from package import module`` names the module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                inner = f"{node.module}.{alias.name}"
                found.add(inner if inner in modules else node.module)
    return found & modules


def test_no_import_cycle_inside_the_integrations_type_only_imports_included() -> None:
    package = "durable.integrations"
    modules: dict[str, Path] = {}
    for path in INTEGRATIONS.rglob("*.py"):
        parts = [*package.split("."), *path.relative_to(INTEGRATIONS).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    edges = {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), list(edges[start])
        while todo:
            cur = todo.pop()
            if cur == goal:
                return True
            if cur not in seen:
                seen.add(cur)
                todo.extend(edges[cur])
        return False

    cycles = sorted(name for name in modules if reaches(name, name))
    assert cycles == []
