"""pydantic-ai agents, unchanged, as durable runs: their model requests, tool calls and MCP
calls are the run's steps (``pip install 'durable-agents[pydantic-ai]'``).

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

The shape is that of pydantic-ai's own durability capabilities (``TemporalDurability``,
``DBOSDurability``, ``PrefectDurability``): a capability attached to the agent, that makes
each model request and each tool call a durable unit (here, a step of the run's log), with
message history carried as JSON. Here:

- A registered capability is a code agent (``durable.code``) whose function runs
  ``agent.run`` with the run's input (``RunInput``: prompt or multimodal parts, history,
  deferred tool results, usage limits, a model id or the name of one of its ``models``,
  metadata), the pydantic-ai run id set to the durable run id. No usage limit applies
  unless the input gives one: the run's budgets bound it; reaching either ends the run
  ``failed`` with reason ``budget_exhausted``.
- Each model request is the step ``<name>.model``: ``effect_free`` (sent again at once after
  a crash), ``model`` (counted against the "model_calls" budget, its usage against
  "tokens"), its arguments logged as a digest; sent with the step's key as an
  ``Idempotency-Key`` header and a timeout no later than the step's deadline; with
  ``stream=True`` streamed, its text published to the run's followers. pydantic-ai's
  ``UserError`` and ``UsageLimitExceeded`` are never retried.
- Each tool call is the step ``<name>.tool.<tool>`` (``<name>.tool.<toolset id>.<tool>`` for
  a toolset other than the agent's own), with an idempotency key the tool reads with
  ``step_context()`` and, after a crash, the ``lookup`` of its ``StepOptions``. A tool without
  a lookup whose call a crash interrupted waits in ``waiting_external`` for an operator
  (``durable settle``): mark reads ``effect_free``. The calls of one model reply run in
  parallel (one parallel group); a tool that needs an approval runs alone.
  ``requires_approval=True`` tools wait in ``waiting_approval`` for an approver bound to the
  call's digest; a rejection is told to the model as a denied call.
- An MCP server (``MCPToolset(..., id=...)``) is pinned per run: its tool list is recorded
  once (``durable.integrations.pydantic_ai.mcp``), each call is a step with its key in
  ``_meta``, read-only tools are effect-free.
- A run that continues another (a named session's turn, ``start(..., session=...)``, or
  ``continue_from``) gets that run's kept conversation as its ``message_history``; a
  session's run keeps its messages for the next turn
  (``durable.integrations.pydantic_ai.run``).
- ``RunCancelled`` (``ctx.cancel()`` in a tool) ends the run ``canceled``; a step failure
  (a response over ``DURABLE_MAX_RESULT_BYTES``, a rejected call) ends it ``failed`` naming it.

Recovery re-executes the function: every step in the log returns its recorded outcome, so no
recorded model request is sent again and no recorded tool call runs again. A step's identity,
checked on re-execution, is its arguments as JSON, with timestamps left out, and the ids
pydantic-ai draws at random for capabilities without one (``<thinking:3f9a1c>``) without
their random part.

Limits: the agent's instructions, history processors and output functions run in the
function and are re-executed on recovery (deterministic, without effects); an
event-stream handler (``event_stream_handler=``) is not shown a recorded request's or tool
call's events again (the result of the call a crash interrupted is shown, not its call
event, which was); a dynamic
toolset's calls are one step per toolset (``<name>.tool.<id>.call``); toolsets other than
function, dynamic and MCP ones are refused at registration; a tool that raises
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
