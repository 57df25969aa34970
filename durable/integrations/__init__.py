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

Each framework folder gives its roles the same module names where it has them:

- ``agent``: the durable agent the user wraps their agent with (pydantic-ai's
  ``RedisDurability`` capability and ``DurableAgent``; the OpenAI Agents SDK's
  ``DurableAgent``), which registers a code agent whose function runs the framework's run;
- ``run``: the run's input, what the function and the step tools share, the binding of the
  function to its durable run, the conversation a run continues and keeps, and what ended
  the framework's run;
- ``model``, ``mcp`` (and the OpenAI Agents SDK's ``tools``): a model request, an MCP
  server, a tool call, and what this system adds to each (the step's key and deadline sent
  downstream). pydantic-ai's folder is an engine on pydantic-ai's own durability base
  (``pydantic_ai.durable_exec``), which wraps the model and the toolsets itself: its
  ``backend`` runs each operation the base hands it as one step, ``steps`` holds the step
  tools an agent registers.

A role only one framework has stands alone when it is large enough: the OpenAI Agents SDK's
``handoffs`` (a handoff's step and the run context its callback changed), LangGraph's
``saver`` and ``records`` (its checkpointer kept in the run's log, and the JSON of its
entries) and ``binding`` (the run's steps, named by the LangGraph task that takes them).
"""
