"""``durable mcp``: added to the CLI through the ``durable.commands`` entry point group.

``durable mcp --new-token NAME [--tenant T]`` prints a new token and the entry to add to the
tokens file; ``durable mcp`` serves Streamable HTTP at ``/mcp`` (``--tokens FILE`` or
``DURABLE_MCP_TOKENS``, and/or the console's users, ``--users FILE`` or
``DURABLE_CONSOLE_USERS``; ``--dev``: no token, on a loopback address only); ``durable mcp
--stdio`` serves one client on stdin and stdout, as the caller whose token is
``DURABLE_MCP_TOKEN`` (checked against the tokens file), or with ``--dev`` as the
development caller.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from durable.client import Client
from durable.errors import UsageError
from durable.flow import tenants
from durable.settings import Settings

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


def cmd_mcp(args: argparse.Namespace) -> int:
    from durable.security.callers import Access, Caller, Tokens, new_token
    from durable.security.users import Users

    if args.new_token:
        token, digest = new_token()
        tenants.checked(args.tenant or None, Caller(args.new_token).owner, None)
        print(f"token (give it to the caller; it is not kept): {token}\n\n"
              f"[tokens.{args.new_token}]\nsha256 = \"{digest}\"\ntenant = \"{args.tenant or ''}\"")
        return 0
    settings = Settings()
    if args.wait_s is not None:
        try:  # checked as the variable is
            settings = settings.replace(mcp_wait_s=args.wait_s)
        except ValidationError as exc:
            raise UsageError(f"--wait-s {args.wait_s}: "
                             f"{exc.errors()[0]['msg'].lower()}") from None
    wait_s = settings.mcp.wait_s
    tokens_file = args.tokens or settings.mcp.tokens
    tokens = Tokens.load(Path(tokens_file)) if tokens_file else None
    if args.stdio:
        return serve_stdio(settings, _stdio_caller(args, settings, tokens), wait_s)
    users_file = Path(args.users) if args.users else settings.console.users
    host = args.host or settings.mcp.host
    access: Access | None = None
    dev: Caller | None = None
    if args.dev:
        if host not in LOOPBACK:
            raise UsageError(f"--dev serves without a token: only on a loopback address, not "
                             f"{host!r}")
        dev = Caller(args.dev_user, args.tenant or "")
    elif tokens is None and not users_file:
        raise UsageError("set DURABLE_MCP_TOKENS (or --tokens) to the tokens file and/or "
                         "DURABLE_CONSOLE_USERS (or --users) to the console's users file, or "
                         "use --dev on a loopback address")
    else:
        access = Access(tokens, Users.load(users_file) if users_file else None)
    return serve_http(settings, host, settings.mcp.port if args.port is None else args.port,
                      access, dev, wait_s)


def _stdio_caller(args: argparse.Namespace, settings: Settings, tokens: Any) -> Any:
    """Who the client of a stdio server is: the token in the environment, or ``--dev``."""
    from durable.security.callers import Caller

    if args.dev:
        return Caller(args.dev_user, args.tenant or "")
    secret = settings.mcp.token
    token = secret.get_secret_value().strip() if secret is not None else ""
    if tokens is None or not token:
        raise UsageError("durable mcp --stdio: set DURABLE_MCP_TOKEN to the caller's token "
                         "and DURABLE_MCP_TOKENS (or --tokens) to the tokens file, or use "
                         "--dev")
    caller = tokens.token(token)
    if caller is None:
        raise UsageError("durable mcp --stdio: DURABLE_MCP_TOKEN is not a token of the "
                         "tokens file")
    return caller


def _imports() -> tuple[Any, Any, Any]:
    try:
        import uvicorn

        from .app import build_app
        from .server import build_server
    except ModuleNotFoundError as exc:  # an extra, not a hard dependency
        raise UsageError(f"durable mcp needs {exc.name!r}: pip install "
                         "'durable-agents[mcp-server]'") from None
    return uvicorn, build_app, build_server


def _logging() -> None:
    from .app import ClosedSessionRecords

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(ClosedSessionRecords())
    for noisy in ("mcp.server.streamable_http_manager", "mcp.server.streamable_http"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def serve_http(settings: Settings, host: str, port: int, access: Any, dev: Any,
               wait_s: float) -> int:
    uvicorn, build_app, build_server = _imports()
    from .door import Door

    _logging()
    client = Client(settings)
    door = Door(client, wait_s=wait_s)
    limit = 2 * settings.payloads.max_payload_bytes + 65536
    app = build_app(build_server(door, _version()), access, host=host, dev_caller=dev,
                    body_limit=limit)
    logging.getLogger("durable.mcp").info(
        "mcp started: http://%s:%d/mcp%s", host, port,
        f" (development mode: no token, every caller is {dev.name!r})" if dev else "")
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning",
                    timeout_graceful_shutdown=2)
    finally:
        client.close()
    return 0


def serve_stdio(settings: Settings, caller: Any, wait_s: float) -> int:
    _imports()
    from .door import Door
    from .server import on_stdio

    _logging()
    client = Client(settings)
    logging.getLogger("durable.mcp").info("mcp started on stdio, as %r (tenant %r)",
                                          caller.name, caller.tenant)
    try:
        on_stdio(Door(client, wait_s=wait_s, stdio_caller=caller), _version())
    finally:
        client.close()
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("durable-agents")
    except PackageNotFoundError:
        return ""


def register(add: Callable[..., Any]) -> None:
    sp = add("mcp", cmd_mcp, "serve the published agents as MCP tools (their calls: "
             "durable tasks)", js=False)
    sp.add_argument("--stdio", action="store_true",
                    help="serve one client on stdin/stdout (its token: DURABLE_MCP_TOKEN)")
    sp.add_argument("--host", default=None,
                    help="address to listen on (DURABLE_MCP_HOST, 127.0.0.1)")
    sp.add_argument("--port", type=int, default=None,
                    help="port to listen on (DURABLE_MCP_PORT, 8720)")
    sp.add_argument("--tokens", metavar="FILE",
                    help="the bearer tokens file (DURABLE_MCP_TOKENS)")
    sp.add_argument("--users", metavar="FILE",
                    help="also admit the console's operators by HTTP Basic credentials "
                    "(default: DURABLE_CONSOLE_USERS, if set)")
    sp.add_argument("--wait-s", metavar="S",
                    help="how long a call without a task waits for its run before it "
                    "answers with the task (DURABLE_MCP_WAIT_S, 30)")
    sp.add_argument("--dev", action="store_true",
                    help="development mode: no token (HTTP only on a loopback address)")
    sp.add_argument("--dev-user", default="dev", metavar="NAME",
                    help="the caller every request is in development mode (dev)")
    sp.add_argument("--tenant", default="", metavar="T",
                    help="with --dev or --new-token: the tenant of the caller's runs")
    sp.add_argument("--new-token", metavar="NAME",
                    help="print a new token for the caller NAME and its tokens file entry")
