"""``DurableAgent``: the durability capability for an agent built without it (a thin
wrapper: ``RedisDurability(...).register(agent)``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_ai.agent import AbstractAgent
from pydantic_ai.messages import ModelMessage, UserContent

from durable.integrations.pydantic_ai.capability import RedisDurability
from durable.integrations.pydantic_ai.inputs import prompt_input


class DurableAgent:
    """Runs the pydantic-ai ``agent`` as the durable agent ``name`` (registered on
    construction, with its step tools; import the module that builds it in the workers,
    through ``DURABLE_AGENTS``). Takes ``RedisDurability``'s options; an agent that already
    carries a ``RedisDurability`` is registered with that one (and no options)."""

    def __init__(self, agent: AbstractAgent[Any, Any], **options: Any) -> None:
        attached = _attached(agent)
        if attached is not None:
            if options:
                raise ValueError(f"agent {agent.name!r} carries a RedisDurability already: "
                                 "give the options to it, not to DurableAgent")
            self.durability = attached.register()
        else:
            self.durability = RedisDurability(**options).register(agent)
        self.agent = agent
        self.name = self.durability.name
        self.model_step = self.durability.model_step
        self.tool_steps = self.durability.tool_steps

    @staticmethod
    def prompt_input(prompt: str | Sequence[UserContent] | None,
                     message_history: Sequence[ModelMessage] | None = None,
                     **fields: Any) -> dict[str, Any]:
        """A run's input: ``client.start(name, DurableAgent.prompt_input("...", messages))``."""
        return prompt_input(prompt, message_history, **fields)


def _attached(agent: AbstractAgent[Any, Any]) -> RedisDurability | None:
    found: list[RedisDurability] = []

    def visit(cap: Any) -> None:
        if isinstance(cap, RedisDurability):
            found.append(cap)

    root = getattr(agent, "root_capability", None) or getattr(agent, "_root_capability", None)
    if root is not None and hasattr(root, "apply"):
        root.apply(visit)
    return found[0] if found else None
