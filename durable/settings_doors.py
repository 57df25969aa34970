"""The settings of the front doors: the console, the A2A server and the MCP server
(``durable.settings`` reads them with the others: ``settings.console``, ``settings.a2a``,
``settings.mcp``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

#: As ``durable.settings``'s groups: read from the variable named by their alias, or given
#: by field name.
_GROUP = SettingsConfigDict(extra="ignore", populate_by_name=True)


class ConsoleSettings(BaseSettings):
    """The console."""

    model_config = _GROUP

    users: Path | None = Field(
        default=None, validation_alias="DURABLE_CONSOLE_USERS",
        description="The console's users file (TOML or JSON): name -> scrypt password hash "
        "and roles (viewer, operator, approver). Required unless `durable console --dev`.")
    secret: str | None = Field(
        default=None, validation_alias="DURABLE_CONSOLE_SECRET",
        description="Key that signs the console's session cookies; unset: a random one per "
        "process (everyone logs in again after a restart).")
    secure_cookies: bool = Field(
        default=False, validation_alias="DURABLE_CONSOLE_SECURE_COOKIES",
        description="Give the console's session cookie the Secure flag (browsers send it "
        "over HTTPS only) and send Strict-Transport-Security: for a console served over "
        "TLS, directly or behind a proxy. Also `durable console --secure-cookies`.")
    host: str = Field(
        default="127.0.0.1", validation_alias="DURABLE_CONSOLE_HOST",
        description="Address `durable console` listens on (also `--host`): put it behind a "
        "TLS proxy, or set 0.0.0.0.")
    port: int = Field(default=8700, ge=0, le=65535, validation_alias="DURABLE_CONSOLE_PORT",
                      description="Port `durable console` listens on (also `--port`).")


class A2ASettings(BaseSettings):
    """The A2A server (``durable a2a``)."""

    model_config = _GROUP

    tokens: Path | None = Field(
        default=None, validation_alias="DURABLE_A2A_TOKENS",
        description="The A2A server's bearer tokens file (TOML: each token's SHA-256 and "
        "tenant; `durable a2a --new-token` prints an entry). Also `--tokens`.")
    host: str = Field(
        default="127.0.0.1", validation_alias="DURABLE_A2A_HOST",
        description="Address `durable a2a` listens on (also `--host`).")
    port: int = Field(default=8710, ge=0, le=65535, validation_alias="DURABLE_A2A_PORT",
                      description="Port `durable a2a` listens on (also `--port`).")
    push_secret: SecretStr | None = Field(
        default=None, validation_alias="DURABLE_A2A_PUSH_SECRET",
        description="Signs the A2A server's push notifications (16 characters or more); "
        "unset: no push notifications. Also `--push-secret`.")
    agent: str | None = Field(
        default=None, validation_alias="DURABLE_A2A_AGENT",
        description="The published agent whose card `durable a2a` serves at the host's "
        "`/.well-known/agent-card.json` (also `--agent`); unset: the only one published "
        "(with several and none named, that address answers 404 naming this setting).")


class McpSettings(BaseSettings):
    """The MCP server (``durable mcp``)."""

    model_config = _GROUP

    tokens: Path | None = Field(
        default=None, validation_alias="DURABLE_MCP_TOKENS",
        description="The MCP server's bearer tokens file (the A2A server's format: each "
        "token's SHA-256 and tenant; `durable mcp --new-token` prints an entry). Also "
        "`--tokens`.")
    token: SecretStr | None = Field(
        default=None, validation_alias="DURABLE_MCP_TOKEN",
        description="`durable mcp --stdio`: the token of the caller it serves (one of the "
        "tokens file's), set by the host that launches it.")
    host: str = Field(
        default="127.0.0.1", validation_alias="DURABLE_MCP_HOST",
        description="Address `durable mcp` listens on (also `--host`).")
    port: int = Field(default=8720, ge=0, le=65535, validation_alias="DURABLE_MCP_PORT",
                      description="Port `durable mcp` listens on (also `--port`).")
    wait_s: float = Field(
        default=30.0, ge=0, le=3600, validation_alias="DURABLE_MCP_WAIT_S",
        description="How long a `tools/call` without a task waits for its run before it "
        "answers with the task to poll (clients give up on a call at about a minute). Also "
        "`--wait-s`.")
