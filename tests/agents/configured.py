"""The agent of the configuration tests (``tests/test_configuration.py``): a deployment's
configuration comes from the environment, read when the module is imported, so a worker
started with other values is a new deployment of the same code.

``TEST_MODEL`` (default ``model-a``) is its model, ``TEST_PROMPT`` the instructions whose
digest it pins, and ``TEST_MODEL_POLICY`` (default ``continue``) what a resume does when the
model changed. It waits for input, then takes a model step (``configured.think``, told what
changed when its policy is ``replan``) and one effect (``sqlwrite``, counted in ``TEST_DB``),
and finishes with the model of its pin and what the model step was told.
"""

from __future__ import annotations

import os
from typing import Any

from durable.agents import (
    Agent,
    Call,
    Decision,
    Finish,
    Lookup,
    Registry,
    Tool,
    ToolContext,
    Wait,
    register,
)
from durable.agents.configuration import short_digest
from durable.log.state import RunState
from tests.agents.basic import EchoInput, SqlWrite  # noqa: F401  (registers ``sqlwrite``)


@register
class Think(Tool):
    """A model step that sends nothing anywhere: it returns what it was given."""

    name = "configured.think"
    model = True
    effect_free = True

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return {"told": args.get("changes", {})}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@register
class Configured(Agent):
    name = "configured"
    input_model = EchoInput
    tools = ("configured.think", "sqlwrite")
    on_configuration_change = {"model": os.environ.get("TEST_MODEL_POLICY",  # type: ignore[dict-item]
                                                       "continue")}

    def configuration(self, tools: Registry) -> dict[str, str]:
        return {**super().configuration(tools), "model": os.environ.get("TEST_MODEL", "model-a"),
                "prompt": short_digest(os.environ.get("TEST_PROMPT", "be brief"))}

    def decide(self, state: RunState) -> Decision:
        if state.last_wait is None:
            return Wait("input", reason="go on?", timeout_s=600)
        if state.step == 0:
            return Call("configured.think", {"changes": state.config_changes})
        if state.step == 1:
            return Call("sqlwrite", {"n": 1})
        think = state.actions[1]
        return Finish({"model": state.config.get("model"), "told": think.result["told"]})
