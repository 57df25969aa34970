"""Tool schemas for model steps, derived from the tools' argument models
(``durable.tool_schemas``): what the model is told is what the code declares."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pytest
from pydantic import BaseModel, Field

from durable.agents import Lookup, Registry, Tool, ToolContext
from durable.code import CodeAgent
from durable.errors import UnknownTool, UsageError
from durable.models import Chat, agent_tool_schemas, tool_schema, tool_schemas
from examples.agents.assistant import TOOLS


class Where(BaseModel):
    city: str
    country: str = "FR"


class ForecastArgs(BaseModel):
    """Tell the weather at a place.

    Anything after the first paragraph is for the code's readers."""

    where: Where
    days: int = Field(default=1, ge=1, le=7, description="how many days ahead")
    unit: Literal["C", "F"] = "C"


class Forecast(Tool):
    """Calls the weather service (this docstring is for the code's readers)."""

    name = "forecast"
    args_model: ClassVar[type[BaseModel] | None] = ForecastArgs

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return {}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


class Bare(Forecast):
    name = "bare"
    args_model = None


class Dotted(Forecast):
    """Look something up."""

    name = "look.up"


def _registry() -> Registry:
    reg = Registry()
    for tool in (Forecast(), Bare(), Dotted(), Chat()):
        reg.add_tool(tool)
    agent = type("weather_agent", (CodeAgent,), {"name": "weather", "tools": (
        "chat", "forecast", "bare")})()
    reg.add_agent(agent)
    return reg


def test_a_schema_is_the_argument_models_with_its_docstring_as_description() -> None:
    schema = tool_schema(Forecast())
    fn = schema["function"]
    assert schema["type"] == "function" and fn["name"] == "forecast"
    assert fn["description"] == "Tell the weather at a place."
    params = fn["parameters"]
    assert params["type"] == "object" and params["required"] == ["where"]
    assert params["properties"]["days"] == {"default": 1, "description": "how many days ahead",
                                            "maximum": 7, "minimum": 1, "type": "integer"}
    assert params["properties"]["unit"] == {"default": "C", "enum": ["C", "F"],
                                            "type": "string"}
    assert params["properties"]["where"] == {"$ref": "#/$defs/Where"}
    assert params["$defs"]["Where"]["required"] == ["city"]
    assert "title" not in str(params)  # pydantic's generated titles are left out


def test_tools_that_cannot_be_described_are_refused_by_name() -> None:
    reg = _registry()
    with pytest.raises(UsageError, match="'bare' declares no args_model"):
        tool_schemas(["forecast", "bare"], reg)
    with pytest.raises(UsageError, match=r"'look\.up'.*A-Z a-z 0-9 _ -"):
        tool_schemas(["look.up"], reg)
    with pytest.raises(UnknownTool):
        tool_schemas(["nowhere"], reg)


def test_an_agents_callable_tools_are_those_with_an_argument_model() -> None:
    assert [s["function"]["name"] for s in agent_tool_schemas("weather", _registry())] == [
        "forecast"]


def test_the_assistants_tools_are_derived_from_the_pipelines_tools() -> None:
    notify, write = (t["function"] for t in TOOLS)
    assert (notify["name"], write["name"]) == ("notify", "write")
    assert notify["description"] == "Send a notification to a recipient (once per call)."
    assert notify["parameters"]["required"] == ["recipient", "message"]
    assert write["parameters"]["required"] == ["source", "summary"]
    summary = write["parameters"]["$defs"]["ReportSummary"]
    assert summary["properties"] == {"count": {"type": "integer"}, "total": {"type": "number"}}
