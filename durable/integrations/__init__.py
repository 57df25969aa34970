"""Integrations with agent frameworks, each an optional extra: nothing here is imported by the
library itself, and each module imports its framework when it is imported.

- ``durable.integrations.pydantic_ai``: a pydantic-ai ``Agent`` as a durable run
  (``pip install 'durable-agents[pydantic-ai]'``), MCP servers included.
- ``durable.integrations.openai_agents``: an OpenAI Agents SDK ``Agent`` as a durable run
  (``pip install 'durable-agents[openai-agents]'``), MCP servers included.
- ``durable.integrations.langgraph``: a compiled LangGraph graph (``StateGraph`` or
  ``@entrypoint``) as a durable run (``pip install 'durable-agents[langgraph]'``).
- ``durable.integrations.mcp``: an MCP server's tools as steps of a code agent
  (``pip install 'durable-agents[mcp]'``).

What they share, as pydantic-ai's ``durable_exec/`` shares a base beside one folder per
engine: ``base`` (one ``StepOptions`` and its default timeout, the step a step tool's
coroutine runs in, ``run_in_step`` and ``step_context()``, the bases of the step tools, the
pair of MCP steps, the JSON of a step) and ``mcp_sessions`` (one MCP session per worker and
server, reopened when the server died). Each framework folder holds only its adapter, and
imports go one way: from a folder down to these modules.

Both framework folders give the same role the same module:

- ``agent``: the durable agent the user wraps their agent with (pydantic-ai's
  ``RedisDurability`` capability and ``DurableAgent``; the OpenAI Agents SDK's
  ``DurableAgent``), which registers a code agent whose function runs the framework's run;
- ``run``: the run's input, what the function and the step tools share (what the steps know
  of their owner, the binding of the function to its durable run), the conversation a run
  continues and keeps, and what ended the framework's run;
- ``model``, ``tools``, ``mcp``: a model request, a tool call, an MCP server, each as a step:
  the function's side (the framework's model, tool or server whose call takes the step), the
  worker's side (the step tool that performs it) and the JSON the step records.

A role only one framework has stands alone when it is large enough: the OpenAI Agents SDK's
``handoffs`` (a handoff's step and the run context its callback changed), LangGraph's
``saver`` and ``records`` (its checkpointer kept in the run's log, and the JSON of its
entries) and ``binding`` (the run's steps, named by the LangGraph task that takes them).
"""
