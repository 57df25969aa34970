"""``durable a2a``: added to the CLI through the ``durable.commands`` entry point group.

``durable a2a --new-token NAME [--tenant T]`` prints a new token and the entry to add to the
tokens file; ``durable a2a`` serves (``--tokens FILE`` or ``DURABLE_A2A_TOKENS``, and/or the
console's users, ``--users FILE`` or ``DURABLE_CONSOLE_USERS``; ``--dev``: no token, on a
loopback address only).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable.client import Client
from durable.errors import UsageError
from durable.flow import tenants
from durable.settings import Settings

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})

#: What the SDK logs, with a traceback, when it refuses a malformed request (the caller's
#: mistake, answered with an error object) or cannot deliver a push notification (to the
#: URL the caller gave: unreachable, refusing). Logged here as one line each, with the
#: error's type and message.
REFUSALS = ("Failed to validate base JSON-RPC request", "Failed to parse request params",
            "Error sending push-notification")


class OneLineRefusals(logging.Filter):
    """Drops the traceback of the SDK's log records of a caller's mistakes (anyone can send
    them: a page of traceback each would flood the log), keeping the error's one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("a2a.") and str(record.msg).startswith(REFUSALS):
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                said = f" {type(exc).__name__}: {exc}".replace("%", "%%")
                record.msg = f"{record.msg}{said}"
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


#: The door's name: its callers' runs record the owner ``a2a:<caller>``.
DOOR = "a2a"


def cmd_a2a(args: argparse.Namespace) -> int:
    from durable.security.callers import Access, Caller, Tokens, new_token
    from durable.security.users import Users

    if args.new_token:
        token, digest = new_token()
        tenants.checked(args.tenant or None, Caller(args.new_token, door=DOOR).owner, None)
        print(f"token (give it to the caller; it is not kept): {token}\n\n"
              f"[tokens.{args.new_token}]\nsha256 = \"{digest}\"\ntenant = \"{args.tenant or ''}\"")
        return 0
    settings = Settings()
    tokens_file = args.tokens or settings.a2a.tokens
    users_file = Path(args.users) if args.users else settings.console.users
    host = args.host or settings.a2a.host
    access: Access | None = None
    if args.dev:
        if host not in LOOPBACK:
            raise UsageError(f"--dev serves without a token: only on a loopback address, not "
                             f"{host!r}")
        dev: Caller | None = Caller(args.dev_user, args.tenant or "", DOOR)
    elif not tokens_file and not users_file:
        raise UsageError("set DURABLE_A2A_TOKENS (or --tokens) to the tokens file and/or "
                         "DURABLE_CONSOLE_USERS (or --users) to the console's users file, or "
                         "use --dev on a loopback address")
    else:
        access, dev = Access(Tokens.load(Path(tokens_file), DOOR) if tokens_file else None,
                             Users.load(users_file) if users_file else None, door=DOOR), None
    env_secret = settings.a2a.push_secret
    secret = args.push_secret or (env_secret.get_secret_value() if env_secret else None)
    if secret is not None and len(secret) < 16:
        raise UsageError("DURABLE_A2A_PUSH_SECRET: at least 16 characters")
    return serve(settings, host,
                 settings.a2a.port if args.port is None else args.port, access, dev,
                 args.public_url, secret.encode() if secret else None,
                 args.push_private_urls, args.agent or settings.a2a.agent)


def serve(settings: Settings, host: str, port: int, access: Any, dev: Any,
          public_url: str | None, push_secret: bytes | None = None,
          push_private_urls: bool = False, agent: str | None = None) -> int:
    try:
        import uvicorn

        from .app import build_app
    except ModuleNotFoundError as exc:  # an extra, not a hard dependency
        raise UsageError(f"durable a2a needs {exc.name!r}: pip install "
                         "'durable-agents[a2a]'") from None
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(OneLineRefusals())
    client = Client(settings)
    app = build_app(client, access, dev_caller=dev, public_url=public_url,
                    push_secret=push_secret, push_private_urls=push_private_urls,
                    host_agent=agent)
    logging.getLogger("durable.a2a").info(
        "a2a started: http://%s:%d/agents%s", host, port,
        f" (development mode: no token, every caller is {dev.name!r})" if dev else "")
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning",
                    timeout_graceful_shutdown=2)
    finally:
        client.close()
    return 0


def register(add: Callable[..., Any]) -> None:
    sp = add("a2a", cmd_a2a, "serve the published agents over the A2A protocol", js=False)
    sp.add_argument("--host", help="address to listen on (DURABLE_A2A_HOST, 127.0.0.1)")
    sp.add_argument("--port", type=int, help="port to listen on (DURABLE_A2A_PORT, 8710)")
    sp.add_argument("--tokens", metavar="FILE",
                    help="the bearer tokens file (DURABLE_A2A_TOKENS)")
    sp.add_argument("--users", metavar="FILE",
                    help="also admit the console's operators by HTTP Basic credentials "
                    "(default: DURABLE_CONSOLE_USERS, if set)")
    sp.add_argument("--public-url", metavar="URL",
                    help="the address callers reach this server at, for the agent cards "
                    "(default: the address of each request)")
    sp.add_argument("--agent", metavar="NAME",
                    help="the agent whose card the host's /.well-known/agent-card.json is "
                    "(DURABLE_A2A_AGENT; default: the only one published)")
    sp.add_argument("--dev", action="store_true",
                    help="development mode: no token (only on a loopback address)")
    sp.add_argument("--dev-user", default="dev", metavar="NAME",
                    help="the caller every request is in development mode (dev)")
    sp.add_argument("--tenant", default="", metavar="T",
                    help="with --dev or --new-token: the tenant of the caller's tasks")
    sp.add_argument("--push-secret", metavar="SECRET",
                    help="sign push notifications with this secret and offer them "
                    "(DURABLE_A2A_PUSH_SECRET; unset: no push notifications)")
    sp.add_argument("--push-private-urls", action="store_true",
                    help="let push notifications go to private and loopback addresses "
                    "(default: public http(s) addresses only)")
    sp.add_argument("--new-token", metavar="NAME",
                    help="print a new token for the caller NAME and its tokens file entry")
