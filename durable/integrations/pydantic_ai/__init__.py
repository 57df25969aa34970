"""pydantic-ai agents, unchanged, as durable runs (``pip install 'durable-agents[pydantic-ai]'``).

::

    from pydantic_ai import Agent
    from durable.integrations.pydantic_ai import RedisDurability, StepOptions, step_context

    durability = RedisDurability(tools={
        "find_order": StepOptions(effect_free=True),
        "refund": StepOptions(approver_role="finance", lookup=refund_lookup)})
    support = Agent("openai:gpt-4o", name="support", capabilities=[durability])

    @support.tool_plain
    def find_order(order_id: str) -> dict: ...

    @support.tool_plain(requires_approval=True)
    def refund(order_id: str, cents: int) -> str: ...      # idempotency key: step_context().key

    durability.register()                 # or DurableAgent(support, tools=...) without it
    Client().start("support", {"prompt": "Refund order 42"})   # a worker drives it

``RedisDurability`` is a durability engine on pydantic-ai's public base
(``pydantic_ai.durable_exec``), as its Temporal, DBOS, Prefect and Hatchet engines are: a
``BaseDurabilityCapability`` whose operation backend runs each durable operation pydantic-ai
hands it as one step of the run's log (``backend``). pydantic-ai's base owns what is made
durable and how its values become JSON: model requests, message compaction, token counts,
tool calls, an MCP server's tool list and calls, a dynamic toolset's tools and calls, each
event shown to an event-stream handler, a capability's ``@durable_operation`` methods. This
package owns the rest:

- registration: a registered capability is a code agent (``durable.code``) whose function
  runs ``agent.run`` with the run's input (``RunInput``: prompt or multimodal parts,
  history, deferred tool results, usage limits, a model id or the name of one of its
  ``models``, metadata), the pydantic-ai run id set to the durable run id, and a step tool
  for each tool of its toolsets with the tool's ``StepOptions`` (``steps``). No usage limit
  applies unless the input gives one: the run's budgets bound it; reaching either ends the
  run ``failed`` with reason ``budget_exhausted``;
- the steps' names (``backend.StepNamer``: ``<name>.model``, ``<name>.tool.<tool>``,
  ``<name>.mcp.<id>.call``..., persisted compatibility data) and arguments (a tool's
  arguments; a model request's digest, taken one new message at a time: ``identity``);
- what goes downstream: a model request carries its step's key as an ``Idempotency-Key``
  header and a timeout within its deadline (``model``), an MCP call its key in ``_meta``
  (``mcp``), a tool reads it with ``step_context()``;
- the engine's choices (``agent.ENGINE``): steps recorded as JSON; an MCP session per run,
  opened by its first step; the calls of one model reply as one parallel group; the agent
  graph's waits (between polls of a background job, before a retried request) on the run's
  durable timer (``durable_sleep``: ``ctx.sleep``, holding no worker); a tool that needs an
  approval waits for an approver's signed decision in its step (``waiting_approval``), alone,
  and a rejection is told to the model as a denied call;
- what ends a run: ``ctx.cancel()`` in a tool, even inside its step, ends the run
  ``canceled`` (pydantic-ai refuses a cancel inside a durable unit because its replay would
  not cancel again; here the ``canceled`` event is recorded with the step's outcome);
  ``UsageLimitExceeded`` ends it ``failed`` (``budget_exhausted``), a failed step as it says.

Recovery re-executes the function: every step in the log returns its recorded outcome, so no
recorded model request is sent again, no recorded tool call runs again, and no recorded event
is shown to the handler again. A step's identity is checked on re-execution.

Limits: the agent's instructions, history processors and output functions run in the
function and are re-executed on recovery (deterministic, without effects); toolsets other
than function, dynamic and MCP ones are refused at registration, and a toolset given to one
run (``agent.run(toolsets=...)``) is refused in the run; a tool that raises
``ApprovalRequired`` itself is deferred the pydantic-ai way.
"""

from __future__ import annotations

try:
    import pydantic_ai  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is not installed
    raise ModuleNotFoundError("durable.integrations.pydantic_ai needs pydantic-ai: pip "
                              "install 'durable-agents[pydantic-ai]'", name=exc.name) from None

from durable.integrations.base import StepOptions, step_context
from durable.integrations.pydantic_ai.agent import DurableAgent, RedisDurability
from durable.integrations.pydantic_ai.run import PromptInput, RunInput, prompt_input

__all__ = ["DurableAgent", "PromptInput", "RedisDurability", "RunInput", "StepOptions",
           "prompt_input", "step_context"]
