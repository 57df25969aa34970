"""The parser, the exit codes, and ``main``. Tables for people, ``--json`` for scripts.

Exit codes: 0 ok, 1 a check failed or the run was not found, 2 a usage error, 3 Redis
could not be used (unreachable, credentials, permissions).

The processes built on the library (``durable.workers``, ``durable.reconciler``,
``durable.console``) add their commands through the ``durable.commands`` entry point group:
each entry names a ``register(add)`` function. The library imports none of them. A program
of its own can add more (``main(extra=[register])``: ``python -m examples``).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any, TextIO

import redis
from pydantic import ValidationError

from durable.backend.connection import safe_url
from durable.cli import (
    admin,
    approvers,
    audit,
    config,
    deploy,
    limits,
    regions,
    runs,
    schedules,
)
from durable.cli.output import CHECK_FAILED, OK, UNAVAILABLE, USAGE, Parser
from durable.errors import DurableError, RunNotFound, UsageError
from durable.settings import Settings

#: The entry point group other packages register their commands in.
COMMAND_GROUP = "durable.commands"


def plugins(named: str | None = None) -> list[tuple[str, Callable[..., None]]]:
    """The ``register`` functions of the installed command groups, by entry point name
    (with ``named``, only the group of that name, when one is installed).

    One that cannot be loaded is reported on stderr and left out: the other commands work.
    """
    found = []
    groups = sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name)
    if named is not None and any(ep.name == named for ep in groups):
        groups = [ep for ep in groups if ep.name == named]
    for ep in groups:
        try:
            found.append((ep.name, ep.load()))
        except Exception as exc:
            print(f"durable: commands {ep.name!r} ({ep.value}) unavailable: {exc!r}",
                  file=sys.stderr)
    return found


def build_parser(extra: Sequence[Callable[..., None]] = (), prog: str = "durable",
                 command: str | None = None) -> Parser:
    """Every command: the library's, the installed processes', then ``extra``'s.

    Given the ``command`` about to run, one of the library's leaves the installed processes'
    commands unloaded, and one a process group of that name adds loads that group alone:
    importing a worker, a reconciler and a web console to print a table of runs, or to
    start a worker, made every call pay for all three."""
    p = Parser(prog=prog, description="Durable agent runs on Redis.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    def add(name: str, fn: Any, help: str, run: bool = False, js: bool = True) -> Any:
        sp = sub.add_parser(name, help=help, description=help)
        sp.set_defaults(fn=fn)
        if run:
            sp.add_argument("run", help="run id")
        if js:
            sp.add_argument("--json", action="store_true", help="machine-readable output")
        return sp

    for module in (runs, audit, approvers, schedules, deploy, admin, config, limits, regions):
        module.register(add)
    if command not in sub.choices:
        loaded = plugins(command)  # the group named after the command, else every group
        for _name, register in loaded:
            register(add)
        if command not in sub.choices and [name for name, _ in loaded] == [command]:
            for name, register in plugins():  # that group did not add it: the others
                if name != command:
                    register(add)
    for register in extra:
        register(add)
    return p


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, file: TextIO | None = None, line: str | None = None) -> None:
    print(f"durable: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None, *, extra: Sequence[Callable[..., None]] = (),
         prog: str = "durable") -> int:
    warnings.showwarning = _one_line_warning  # for people: one line, no source quoted
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(extra, prog, command=next(iter(argv), None))
    args = parser.parse_args(argv)
    try:
        code: int = args.fn(args)
        return code
    except RunNotFound as exc:
        return _fail(str(exc), CHECK_FAILED)
    except UsageError as exc:
        return _fail(str(exc), USAGE)
    except ValidationError as exc:  # a setting the environment gives wrong: it names it
        return _fail(settings_problem(exc), USAGE)
    except DurableError as exc:
        return _fail(str(exc), CHECK_FAILED)
    except redis.RedisError as exc:
        return _fail(redis_problem(exc), UNAVAILABLE)
    except BrokenPipeError:
        # The reader went away (``durable log RUN --json | head``): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return OK
    except KeyboardInterrupt:
        return 130


def _fail(message: str, code: int) -> int:
    """Print why the command failed: its last line, whatever a process's other threads
    (a worker's run threads, listeners) were about to log."""
    logging.disable(logging.CRITICAL)
    for handler in logging.getLogger().handlers:
        handler.acquire()  # a record being written now is finished first
        try:
            handler.flush()
        finally:
            handler.release()
    print(f"durable: {message}", file=sys.stderr)
    return code


def settings_problem(exc: ValidationError) -> str:
    """One line for settings the environment gives wrong: each variable, the value given and
    what is wrong with it (pydantic's own message), without pydantic's table around it."""
    said = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        given = err.get("input")
        if where and where not in msg:
            shown = f"{where}={given}" if isinstance(given, str | int | float) else where
            msg = f"{shown}: {msg}"
        said.append(msg)
    what = "setting" if exc.title.endswith("Settings") else f"value ({exc.title})"
    return f"bad {what}: " + "; ".join(said) + (
        " (see docs/reference.md)" if what == "setting" else "")


def redis_problem(exc: redis.RedisError) -> str:
    """One line a user can act on, for a failure talking to Redis (no password in it)."""
    try:
        settings: Settings | None = Settings()
    except ValidationError:  # the settings are the problem then; say what can be said
        settings = None
    where = settings.redis.url if settings else None
    server = safe_url(where) if where else "the embedded server"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "caused error: " in text:  # a pipeline's error: the command's own message is enough
        text = text.split("caused error: ", 1)[1]
    if isinstance(exc, redis.AuthenticationError) or "WRONGPASS" in text or \
            "NOAUTH" in text:
        return f"Redis at {server} refused the credentials: {text} (check the user and " \
               "password: DURABLE_REDIS_USERNAME, DURABLE_REDIS_PASSWORD or the URL)"
    if isinstance(exc, redis.exceptions.NoPermissionError) or "no permissions" in text or \
            "can't run this command" in text:
        user = (settings.redis.username if settings else None) or "this user"
        return f"Redis at {server} denied a command to {user}: {text} (this role may not " \
               "do that; see deploy/users.acl)"
    if where and where.startswith("rediss://") and \
            isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return f"cannot reach Redis at {server} over TLS: {text} (does the server speak " \
               "TLS on that port? are the certificates right?)"
    if isinstance(exc, redis.TimeoutError):
        return f"Redis at {server} did not answer in time: {text}"
    if isinstance(exc, redis.ConnectionError):
        return f"cannot reach Redis at {server}: {text} (is it running? is " \
               "DURABLE_REDIS_URL right?)"
    return f"Redis at {server} answered with an error: {text}"


if __name__ == "__main__":
    sys.exit(main())
