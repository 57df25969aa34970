"""The external systems the tests run against, made here: OpenAI-compatible model servers
(``model``, ``openai``), an MCP stdio server (``mcp``), Redis servers with ACL users or
TLS (``secure``), and the SQLite world the integrations' tools act on
(``integration_world``)."""
