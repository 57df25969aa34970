"""LangGraph graphs, unchanged, as durable runs: each node's execution, chat model request
and tool call is a step of the run's log (``pip install 'durable-agents[langgraph]'``).

::

    from langgraph.graph import StateGraph, MessagesState, START
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.types import interrupt
    from durable.integrations.langgraph import DurableGraph, StepOptions, step_context

    @tool
    def refund(order: str, cents: int) -> str: ...    # idempotency key: step_context().key

    builder = StateGraph(MessagesState)
    builder.add_node("agent", call_model)              # llm.bind_tools([refund]).ainvoke(...)
    builder.add_node("tools", ToolNode([refund]))
    ...
    DurableGraph(builder.compile(), name="support", budgets={"model_calls": 40},
                 tools={"refund": StepOptions(lookup=refund_lookup)})

    Client().start("support", {"input": {"messages": [{"role": "user", "content": "..."}]}})

The shape is that of Temporal's LangGraph plugin (LangGraph's loop runs in the workflow,
each node is a unit of its own), with the node's model requests and tool calls steps of
their own. Here:

- ``DurableGraph(graph, name=...)`` registers a code agent (``durable.code``) named ``name``
  whose function invokes the graph (``ainvoke``) on a copy whose nodes are wrapped, without
  LangGraph's checkpointer: the run's log is the checkpoint. Input: ``{"input": the graph's
  input, "context": its runtime context}`` (``GraphInput``); result: the final state as JSON.
- Each chat model request (any LangChain chat model a node calls: ``invoke``, ``ainvoke``,
  ``bind_tools``, ``with_structured_output``...) is the step ``<name>.model``: effect-free
  (sent again at once after a crash), ``model`` (counted against the "model_calls" budget,
  its usage against "tokens"), its arguments logged as a digest; for LangChain's OpenAI
  models it carries the step's key as an ``Idempotency-Key`` header and its deadline as the
  client's timeout; streamed, each text delta published to the run's followers as
  ``{"delta": text}`` (``stream=False``: plain requests).
- Each LangChain tool call (a ``ToolNode``'s, or a tool a node invokes itself, named in
  ``tools=``) is the step ``<name>.tool.<tool>``: claimed with an idempotency key the tool
  reads with ``step_context()``, resolved after a crash by the ``lookup`` of its
  ``StepOptions``, waiting for a signed approval with ``requires_approval`` (a rejection is
  told to the model as the tool's error message).
- Each node execution ends with the step ``<name>.node.<node>``, which records its update
  and publishes it to the followers as ``{"node", "update"}``.
- ``interrupt(value)`` in a node is a durable wait (``waiting_input``, holding no worker)
  whose data is ``value``, answered by ``durable respond RUN ANSWER`` (or
  ``Client.respond``); ``interrupt()`` then returns the answer. LangGraph runs the node
  again from its start, as it does on resume, but every request and tool call the node
  made before the interrupt gets its recorded outcome: nothing is sent or applied twice.
- A cancel cancels the model request in flight (and a tool step marked ``cancellable``) and
  ends the run at the next step.

Recovery re-executes the function. A node whose update was recorded is not run again when
it ran alone in its superstep, took no interrupt and its update loads back exactly from
LangChain's JSON: the recorded update is given back and the run goes past its steps
(``durable.integrations.langgraph.nodes.replayed``). Any other node runs again with every
step in the log returning its recorded outcome, so a completed node's requests and tool
calls are not sent again; a node the crash interrupted goes on from its first step not
recorded. Each step of a
node is named by the node's superstep and name and its place among the node's calls, so a
node LangGraph runs again (its ``RetryPolicy``, an interrupt) gets the same outcomes.

Limits: a node's code between its steps may run again (after an interrupt's answer, on
recovery when its update cannot be given back): deterministic, without effects of its own
(put effects in tools); ``astream`` of a chat model inside a node is
one step, given back as one chunk (followers get the tokens); interrupts inside a subgraph,
static breakpoints (``interrupt_before``/``after``) and ``Command(resume=...)`` are not
supported; a tool returning a ``Command`` is recorded as its JSON.
"""

from __future__ import annotations

try:
    import langgraph  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is not installed
    raise ModuleNotFoundError("durable.integrations.langgraph needs LangGraph: pip install "
                              "'durable-agents[langgraph]'", name=exc.name) from None

from durable.integrations.base import StepOptions, step_context
from durable.integrations.langgraph.agent import DurableGraph
from durable.integrations.langgraph.run import GraphInput, GraphRunFailed
from durable.integrations.langgraph.saver import LogSaver

__all__ = ["DurableGraph", "GraphInput", "GraphRunFailed", "LogSaver", "StepOptions",
           "step_context"]
