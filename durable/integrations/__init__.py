"""Integrations with agent frameworks, each an optional extra: nothing here is imported by the
library itself, and each module imports its framework when it is imported.

- ``durable.integrations.pydantic_ai``: a pydantic-ai ``Agent`` as a durable run
  (``pip install 'durable-agents[pydantic-ai]'``), MCP servers included.
- ``durable.integrations.openai_agents``: an OpenAI Agents SDK ``Agent`` as a durable run
  (``pip install 'durable-agents[openai-agents]'``), MCP servers included.
- ``durable.integrations.mcp``: an MCP server's tools as steps of a code agent
  (``pip install 'durable-agents[mcp]'``).

What they share, as pydantic-ai's ``durable_exec/`` shares a base beside one folder per
engine: ``base`` (one ``StepOptions`` and its default timeout, the step a step tool's
coroutine runs in, ``run_in_step`` and ``step_context()``, the bases of the step tools, the
pair of MCP steps, the JSON of a step) and ``mcp_sessions`` (one MCP session per worker and
server, reopened when the server died). Each framework folder holds only its adapter, and
imports go one way: from a folder down to these modules.
"""
