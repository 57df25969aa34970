"""The pydantic-ai capability does what pydantic-ai's own durable-execution tests expect of
its Temporal, DBOS and Prefect integrations: an agent it cannot make durable is refused when
it is built, with the reason; large tool returns and model responses are kept beside the run;
one toolset instance serves two agents; a run chooses its model.

Real worker processes, SIGKILLed for real; the models are pydantic-ai ``FunctionModel``s
counting their requests per idempotency key, the tools write their effects into a SQLite
database that never deduplicates (``TEST_DB_DEDUPE=0``).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from durable.agents import registry
from durable.errors import UsageError
from durable.integrations.pydantic_ai import DurableAgent, RedisDurability


def _registered(prefix: str) -> list[str]:
    return [n for n in [*registry.agents, *registry.tools] if n.startswith(prefix)]


# In-process: what building a durable agent refuses, before anything is registered.


def test_an_agent_without_a_model_is_refused_when_built() -> None:
    with pytest.raises(UsageError, match="needs a model"):
        DurableAgent(Agent(None, name="pai_nomodel"))
    assert _registered("pai_nomodel") == []
    durability = RedisDurability()
    Agent(None, name="pai_nomodel_cap", capabilities=[durability])
    with pytest.raises(UsageError, match="needs a model"):
        durability.register()
    assert _registered("pai_nomodel_cap") == []
    # The capability's own model is enough.
    DurableAgent(Agent(None, name="pai_capmodel"), model=TestModel())
    assert "pai_capmodel" in registry.agents


def test_model_settings_that_are_not_data_are_refused_when_built() -> None:
    unserializable: Any = {"extra_body": {"hook": lambda: 1}}
    with pytest.raises(UsageError, match=r"model settings .*extra_body"):
        DurableAgent(Agent(TestModel(), name="pai_badsettings", model_settings=unserializable))
    with pytest.raises(UsageError, match=r"model settings .*extra_body"):
        DurableAgent(Agent(TestModel(settings=unserializable), name="pai_badmodelsettings"))
    assert _registered("pai_bad") == []
    DurableAgent(Agent(TestModel(), name="pai_goodsettings",
                       model_settings={"temperature": 0.0, "extra_body": {"seed": 1}}))
    assert "pai_goodsettings" in registry.agents
