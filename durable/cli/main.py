"""The parser, the exit codes, and ``main``. Tables for people, ``--json`` for scripts.

Exit codes: 0 ok, 1 a check failed or the run was not found, 2 a usage error.

The processes built on the library (``workers``, ``reconciler``) and the examples add their
commands through the ``durable.commands`` entry point group: each entry names a
``register(add)`` function. The library imports none of them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any

from durable.cli import admin, audit, runs
from durable.cli.output import CHECK_FAILED, USAGE, Parser
from durable.errors import DurableError, RunNotFound, UsageError

#: The entry point group other packages register their commands in.
COMMAND_GROUP = "durable.commands"


def plugins() -> list[tuple[str, Callable[..., None]]]:
    """The ``register`` functions of the installed command groups, by entry point name.

    One that cannot be loaded is reported on stderr and left out: the other commands work.
    """
    found = []
    for ep in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        try:
            found.append((ep.name, ep.load()))
        except Exception as exc:
            print(f"durable: commands {ep.name!r} ({ep.value}) unavailable: {exc!r}",
                  file=sys.stderr)
    return found


def build_parser() -> Parser:
    p = Parser(prog="durable", description="Durable agent runs on Redis.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    def add(name: str, fn: Any, help: str, run: bool = False, js: bool = True) -> Any:
        sp = sub.add_parser(name, help=help, description=help)
        sp.set_defaults(fn=fn)
        if run:
            sp.add_argument("run", help="run id")
        if js:
            sp.add_argument("--json", action="store_true", help="machine-readable output")
        return sp

    for module in (runs, audit, admin):
        module.register(add)
    for _name, register in plugins():
        register(add)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.fn(args)
        return code
    except RunNotFound as exc:
        print(f"durable: {exc}", file=sys.stderr)
        return CHECK_FAILED
    except UsageError as exc:
        print(f"durable: {exc}", file=sys.stderr)
        return USAGE
    except DurableError as exc:
        print(f"durable: {exc}", file=sys.stderr)
        return CHECK_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
