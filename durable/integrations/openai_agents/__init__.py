"""An OpenAI Agents SDK ``Agent``, unchanged, as a durable run: its model requests, function
tool calls and handoffs are the run's steps (``pip install 'durable-agents[openai-agents]'``).

::

    from agents import Agent, function_tool
    from durable.integrations.openai_agents import DurableAgent, StepOptions, step_context

    @function_tool(needs_approval=True)
    def refund(order_id: str, cents: int) -> str: ...    # idempotency key: step_context().key

    refunds = Agent(name="refunds", tools=[refund], model=...)
    triage = Agent(name="triage", handoffs=[refunds], model=...)

    DurableAgent(triage, name="support", budgets={"model_calls": 40}, tools={
        "refund": StepOptions(approver_role="finance", lookup=refund_lookup)})

    Client().start("support", {"input": "Refund order 42"})   # a worker drives it

The shape is that of the SDK's durable integrations (Temporal's plugin, DBOS's runner): the
agent graph is cloned with a model whose ``get_response`` is a step and function tools whose
``on_invoke_tool`` is a step; the run's function calls ``Runner.run`` on the clone. Here:

- ``DurableAgent(agent, name=...)`` registers a code agent (``durable.code``) named ``name``.
  Input: ``{"input": text or input items}``; result: the final output as JSON (with
  ``return_items=True``, also the conversation's items to continue from, and the last agent).
- Each model request, of any agent of the graph, is the step ``<name>.model``: ``effect_free``
  (sent again at once after a crash), ``model`` (counted against the "model_calls" budget,
  its usage against "tokens"), its arguments logged as a digest. It carries the step's key as
  an ``Idempotency-Key`` header and, for the SDK's OpenAI models, its deadline as the client's
  timeout; it is streamed, each text delta published to the run's followers as
  ``{"delta": text}`` (``stream=False`` to send plain requests), asking for the stream's
  usage (``include_usage``, which the SDK asks only of OpenAI's own server), so the
  "tokens" budget holds with vLLM, LiteLLM or Ollama too. Its recorded result is the
  ``ModelResponse``'s output items, ids and usage. A connection error, 429 or 5xx is
  retried within the step's attempts (``model_retryable``); a bad request never is.
- Each function tool call is the step ``<name>.tool.<tool>`` with arguments
  ``{"call_id", "arguments"}``: claimed with an idempotency key the tool reads with
  ``step_context()``, resolved after a crash by the ``lookup`` of its ``StepOptions``. The
  tool runs with its own error handling, so an exception the SDK would tell the model about
  is recorded as that message; but ``OutcomeUnknown`` leaves the step unknown (resolved by
  the lookup) and the step's ``retryable`` exceptions are retried with the same key. Calls
  of one model reply run as parallel steps, as the SDK runs them concurrently.
- A tool with ``needs_approval=True`` is a step with ``requires_approval``: the run waits in
  ``waiting_approval`` for a signed decision of ``approver_role`` bound to the call's digest
  (``durable.controls.approvals``); the SDK's own interruption is not used. A rejection is
  told to the model with the SDK's rejection message. A callable ``needs_approval`` is asked in the
  function for each call: calls it approves of go through ``<name>.tool.<tool>.approval``.
- A handoff is the step ``<name>.handoff``; the agent handed to is recorded by name, and the
  run goes on with that agent's clone: one run, one conversation, one budget. The handoff's
  ``on_handoff`` runs in the step, at least once (again if a crash came before the step was
  recorded; ``step_context().key`` keys its effects), never once recorded. What it changed in
  the run context is recorded with the step, as JSON, and restored into the context of a
  run executed again, as the types the context declares
  (``durable.integrations.openai_agents.handoffs``); a change JSON cannot carry fails the step.
- A run that continues another (a named session's turn, ``start(..., session=...)``, or
  ``continue_from``) is given that run's kept items first, then its input; a session's run
  keeps ``result.to_input_list()`` for the next turn: the SDK's ``Session`` role, with the
  history in the log (``durable.controls.sessions``).
- ``other.as_child_tool(name)`` (another ``DurableAgent``) is a tool whose call runs that
  agent as a child run (``durable.controls.children``): started once however often this run is
  executed again, waited for holding no worker, its final output the tool's result.

Recovery re-executes the function: every step in the log returns its recorded outcome, so no
recorded model request is sent again and no recorded tool call runs again; the SDK runner
rebuilds its state from them. The SDK's ``max_turns`` defaults to the "model_calls" budget
+ 1 (the budget ends the run first, ``failed`` with ``budget_exhausted``), else 1000. The
SDK's own outcomes (``MaxTurnsExceeded``, a guardrail's tripwire, a malformed reply) fail
the run with their message.

- An agent's MCP servers are pinned per run (``durable.integrations.openai_agents.mcp``): the
  tool list recorded once, each call a keyed step, read-only tools effect-free.

Limits: local tools other than function tools (computer, shell, apply-patch) are refused
when the ``DurableAgent`` is built; hosted tools (web and file search, code
interpreter, image generation, hosted MCP) run inside the model step. Instructions,
guardrails, hooks, handoff input filters and ``is_enabled`` callbacks run in the function and
are executed again on recovery: they must be deterministic and without effects (a guardrail
that calls a model calls it again). A function tool's changes to the run context are not
recorded: a run executed again does not see them (return what later steps need, or set it
in an ``on_handoff``). An agent used as a tool (``agent.as_tool()``) is one
function-tool step. ``run_config.model`` is refused (it would replace the durable models).
"""

from __future__ import annotations

try:
    import agents  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError("durable.integrations.openai_agents needs the OpenAI Agents SDK: "
                      "pip install 'durable-agents[openai-agents]'") from exc

from durable.integrations.base import StepOptions, step_context
from durable.integrations.openai_agents.agent import DurableAgent
from durable.integrations.openai_agents.run import AgentInput, AgentRunFailed

__all__ = ["AgentInput", "AgentRunFailed", "DurableAgent", "StepOptions", "step_context"]
