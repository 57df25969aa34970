"""``durable mcp``: the MCP front door, a process on top of the library.

MCP clients (IDEs, desktop assistants, other agents) call each published agent as a tool;
a call is a durable run, and a task-augmented call (the 2025-11-25 revision's tasks) is
answered at once with its task: task id = run id, ``tasks/get|result|cancel|list`` read and
act on the run. The protocol itself (JSON-RPC, both revisions' handshakes, validation,
Streamable HTTP and stdio, progress and elicitation messages) is the official ``mcp`` SDK's;
what is here maps it onto runs, through ``durable.client.Client`` only.

Modules: ``door`` (what the handlers share: the client, who calls, the runs a caller may
see), ``tools`` (published agents as tools, a call as a run's start), ``tasks`` (a run as a
task, its wait for input as an elicitation, its outcome as a tool result), ``watch``
(following a run for an open request: progress, status, elicitation), ``calls``
(``tools/call`` with and without a task), ``methods`` (``tasks/*``), ``server`` (the SDK's
server with these handlers), ``app`` (Streamable HTTP, callers admitted), ``cli`` (the
``durable mcp`` command).
"""
