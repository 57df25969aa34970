"""LangGraph graphs, unchanged, as durable runs: LangGraph's own checkpointer seam kept in
the run's log, each chat model request and tool call a step of its own
(``pip install 'durable-agents[langgraph]'``).

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

- ``DurableGraph(graph, name=...)`` registers a code agent (``durable.code``) named ``name``
  whose function runs the graph (``astream``) with ``LogSaver`` as its checkpointer
  (``saver``): every checkpoint and every task's pending writes LangGraph puts is an entry
  of the run's log, recorded as the effect-free step ``<name>.checkpoint`` (``records``:
  LangGraph's own serializer, never a pickle; a list channel, a conversation's messages,
  stored as what changed since its previous version). A task's writes are recorded before
  ``put_writes`` returns; a checkpoint with them, or before any step of the next superstep.
  Input: ``{"input": the graph's input, "context": its runtime context}`` (``GraphInput``);
  result: the final state (or the entrypoint's return) as JSON.
- Executed again (after a crash, a hand-back, an interrupt's answer), the function loads the
  saver from the log and LangGraph resumes from its latest checkpoint with its pending
  writes: a finished task or node is never run again, and the one a crash interrupted runs
  again, as under LangGraph's own checkpointer (its counts: a node interrupted and answered
  three times runs four times).
- Each chat model request (any LangChain chat model a node or task calls) is the step
  ``<name>.model``, each LangChain tool call (a ``ToolNode``'s, or one named in ``tools=``)
  the step ``<name>.tool.<tool>`` (``model``, ``tools``): named by the LangGraph task that
  makes it (its id, which LangGraph derives from the checkpoint), the task's attempt and
  its place among equal calls, and found by that name when the task runs again, whatever
  order concurrent tasks make their calls in: its outcome comes back from the log, nothing
  is sent or applied again. The model step carries its key as an ``Idempotency-Key`` for
  LangChain's OpenAI models and streams its text to the followers as ``{"delta": text}``;
  a tool reads its key with ``step_context()``, its ``lookup`` resolves an outcome a crash
  left unknown, ``requires_approval`` makes it wait for a signed decision. A tool's
  ``Command`` (``Command(graph=Command.PARENT, update=...)`` from a subgraph's tool) is
  recorded and given back as it was.
- ``interrupt()`` (in a node, a task or a subgraph) stops the graph as LangGraph stops it;
  the run waits for input (``waiting_input``, no worker held) with the data
  ``{"interrupts": [{"id", "value"}, ...]}``. ``durable respond RUN ANSWER`` (or
  ``Client.respond``) answers: with one interrupt pending, any JSON (what ``interrupt()``
  returns); with several, an object mapping interrupt ids to answers (an answer of another
  shape makes the run ask again, saying why). LangGraph resumes with
  ``Command(resume={id: answer})``.
- Each node's update and each ``get_stream_writer()`` chunk is published to the run's
  followers (``{"node", "update"}``, ``{"custom"}``), never logged.
- LangGraph's own errors (its recursion limit, an invalid update, a node's error once its
  ``RetryPolicy`` gave up) fail the run with LangGraph's message; a cancel cancels the model
  request in flight and ends the run at the next step.

Limits: a node's (or task's) own code between its steps is LangGraph's: it runs again when
LangGraph runs the node again (an interrupt's answer, a crash before its writes were
recorded), so an effect of its own is applied at least once, as under any LangGraph
checkpointer (put effects in tools, or in tasks: a task that returned is never run again);
synchronous nodes and tasks each hold a thread of the event loop's default executor
(``agent.SYNC_THREADS``) while they run; ``astream`` of a chat model inside a node is one
step, given back as one chunk; static breakpoints (``interrupt_before``/``after``) and
subgraphs with a checkpointer of their own are refused; a value changed in place in the
state, not through an update, is not seen by the checkpoint that follows.
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
