"""Tool schemas for model steps, derived from the registered tools' argument models.

A tool that declares ``args_model`` (a pydantic model of its arguments) is described to a
model by that model's JSON schema, so its arguments are written once, in Python::

    class NotifyArgs(BaseModel):
        \"\"\"Send a notification to a recipient (once per call).\"\"\"
        recipient: str = Field(description="an e-mail address")
        message: str

    @register
    class Notify(Tool):
        name = "notify"
        args_model = NotifyArgs

    TOOLS = tool_schemas(["notify"])      # the chat step's ``tools`` argument
    reply = chat(ctx, messages, tools=TOOLS)

Each schema is an OpenAI tool: ``{"type": "function", "function": {"name", "description",
"parameters"}}``; the description is the first paragraph of the argument model's
docstring (what the model is told the function does), else of the tool's own; the
parameters are the model's ``model_json_schema()`` without pydantic's generated titles. A
tool without ``args_model``, or whose name a model API does not accept as a function name
(1-64 of ``A-Z a-z 0-9 _ -``), is refused with a ``UsageError`` naming it. The schemas are
derived again at each call: nothing is cached that could drift from the code.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from typing import Any

from durable.agents import Registry, Tool, registry
from durable.errors import UsageError

#: What model APIs accept as a function name.
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _untitled(schema: Any) -> Any:
    """The schema without the ``title`` pydantic derives from each name (a property
    named ``title`` is kept)."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "properties" and isinstance(value, dict):
                out[key] = {name: _untitled(prop) for name, prop in value.items()}
            elif key == "title" and isinstance(value, str):
                continue
            else:
                out[key] = _untitled(value)
        return out
    if isinstance(schema, list):
        return [_untitled(item) for item in schema]
    return schema


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI tool schema of one tool, from its ``args_model``."""
    model = tool.args_model
    if model is None:
        raise UsageError(f"tool {tool.name!r} declares no args_model: give it a pydantic "
                         "model of its arguments to derive its schema")
    if not FUNCTION_NAME.match(tool.name):
        raise UsageError(f"tool {tool.name!r}: a model calls functions named with 1-64 of "
                         "A-Z a-z 0-9 _ -")
    parameters = _untitled(model.model_json_schema())
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    function: dict[str, Any] = {"name": tool.name}
    told = parameters.pop("description", None)  # the argument model's docstring
    doc = told if isinstance(told, str) else inspect.cleandoc(type(tool).__doc__ or "")
    description = " ".join(doc.split("\n\n")[0].split())
    if description:
        function["description"] = description
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def tool_schemas(names: Iterable[str], tools: Registry | None = None) -> list[dict[str, Any]]:
    """The OpenAI tool schemas of the tools ``names`` (registered in ``tools``, the
    process's registry by default), in that order."""
    found = tools or registry
    return [tool_schema(found.tool(name)) for name in names]


def agent_tool_schemas(agent: str, tools: Registry | None = None) -> list[dict[str, Any]]:
    """The schemas of every tool ``agent`` lists that a model may call: those with an
    ``args_model`` that are not model steps themselves."""
    found = tools or registry
    listed = [found.tool(name) for name in found.agent(agent).tools]
    return [tool_schema(t) for t in listed if t.args_model is not None and not t.model]
