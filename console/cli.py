"""``durable console``: added to the CLI through the ``durable.commands`` entry point group.

``durable console --hash-password`` reads a password on stdin and prints the hash to put
in the users file.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from collections.abc import Callable
from typing import Any

from durable.client import Client
from durable.errors import UsageError
from durable.settings import Settings


def cmd_console(args: argparse.Namespace) -> int:
    from durable.security.users import hash_password

    if args.hash_password:
        password = getpass.getpass("password: ") if sys.stdin.isatty() else \
            sys.stdin.readline().rstrip("\n")
        if not password:
            raise UsageError("an empty password")
        print(hash_password(password))
        return 0
    settings = Settings()
    host = settings.console.host if args.host is None else args.host
    port = settings.console.port if args.port is None else args.port
    return serve(settings, host, port, dev=args.dev, dev_user=args.dev_user,
                 secure_cookies=args.secure_cookies)


def serve(settings: Settings, host: str, port: int, *, dev: bool = False,
          dev_user: str = "dev", secure_cookies: bool = False) -> int:
    try:
        import uvicorn

        from .app import build_app
    except ModuleNotFoundError as exc:  # the console is an extra, not a hard dependency
        raise UsageError(f"the console needs {exc.name!r}: pip install "
                         "'durable-agents[console]'") from None
    from durable.security.users import Users

    from .auth import LOOPBACK, Access

    if dev and host not in LOOPBACK:
        raise UsageError(f"--dev serves without a login: only on a loopback address, not "
                         f"{host!r} (use 127.0.0.1)")
    if dev:
        access = Access(None, dev_user)
    elif settings.console.users is None:
        raise UsageError("set DURABLE_CONSOLE_USERS to the users file (see docs/operations.md, "
                         "Console), or use --dev on a loopback address")
    else:
        access = Access(Users.load(settings.console.users))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if settings.console.secret is None:
        logging.getLogger("durable.console").warning(
            "DURABLE_CONSOLE_SECRET is unset: sessions end when this process does")
    client = Client(settings)
    app = build_app(client, access, secret=settings.console.secret,
                    https_only=secure_cookies or settings.console.secure_cookies)
    logging.getLogger("durable.console").info(
        "console on http://%s:%d/%s", host, port,
        f" (development mode: no login, every request is {dev_user!r})" if dev else "")
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning",
                    timeout_graceful_shutdown=2)
    finally:
        client.redis.close()
    return 0


def register(add: Callable[..., Any]) -> None:
    sp = add("console", cmd_console, "run the web console", js=False)
    sp.add_argument("--host", help="address to listen on (DURABLE_CONSOLE_HOST, 127.0.0.1)")
    sp.add_argument("--port", type=int,
                    help="port to listen on (DURABLE_CONSOLE_PORT, 8700)")
    sp.add_argument("--dev", action="store_true",
                    help="development mode: no login (only on a loopback address)")
    sp.add_argument("--dev-user", default="dev", metavar="NAME",
                    help="the identity every request has in development mode (dev)")
    sp.add_argument("--secure-cookies", action="store_true",
                    help="session cookie with the Secure flag, for a console served over "
                    "HTTPS (DURABLE_CONSOLE_SECURE_COOKIES=1)")
    sp.add_argument("--hash-password", action="store_true",
                    help="read a password on stdin, print its hash for the users file")
