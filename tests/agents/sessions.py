"""Agents whose conversations go on from run to run in named sessions, one per framework,
for the tests of ``durable.controls.sessions`` (worker processes import this module through
``DURABLE_AGENTS``): a pydantic-ai agent and an OpenAI Agents SDK agent, both on the local
OpenAI-compatible server of ``tests.servers.openai`` (``TEST_OPENAI_URL``), whose script for
instructions starting "reader" calls ``read_page`` once per user turn, then says how many
pages it read and how many characters of conversation it was sent. ``read_page`` returns
``TEST_PAGE_CHARS`` characters: a few turns make a conversation past 1 MB."""

from __future__ import annotations

import os

from agents import Agent as SdkAgent
from agents import function_tool
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from durable.integrations import openai_agents as oai
from durable.integrations import pydantic_ai as pai
from tests.agents.openai_agents import LocalProvider

INSTRUCTIONS = "reader: read one page per turn, then say what you read."


def page(n: int) -> str:
    return f"page {n}: " + "x" * int(os.environ.get("TEST_PAGE_CHARS", "350000"))


# pydantic-ai -------------------------------------------------------------------------------

_model = OpenAIChatModel("scripted", provider=OpenAIProvider(
    base_url=os.environ.get("TEST_OPENAI_URL", "http://127.0.0.1:9/v1"), api_key="test"))
pai_durability = pai.RedisDurability(tools={"read_page": pai.StepOptions(effect_free=True)})
pai_reader = Agent(_model, name="pai_reader", instructions=INSTRUCTIONS,
                   capabilities=[pai_durability])


@pai_reader.tool_plain
def read_page(n: int) -> str:
    """Read page ``n``."""
    return page(n)


pai_durability.register()


# The OpenAI Agents SDK --------------------------------------------------------------------

@function_tool(name_override="read_page")
def sdk_read_page(n: int) -> str:
    """Read page ``n``."""
    return page(n)


oai_reader = oai.DurableAgent(
    SdkAgent(name="reader", instructions=INSTRUCTIONS, model="scripted", tools=[sdk_read_page]),
    name="oai_reader", model_provider=LocalProvider(), stream=False,
    tools={"read_page": oai.StepOptions(effect_free=True)})
