"""What every command shares: exit codes, output for people and for scripts, the client."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from durable.client import Client
from durable.errors import UsageError
from durable.settings import Settings

OK, CHECK_FAILED, USAGE, UNAVAILABLE = 0, 1, 2, 3

#: ``add(name, fn, help, run=False, js=True)``: how a module adds its subcommands.
Add = Callable[..., argparse.ArgumentParser]


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 on usage errors, as we want
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"durable: error: {message}\n")


def json_arg(text: str, flag: str) -> object:
    """The JSON an option gives (``--input``, ``--result``...), or ``UsageError`` naming
    the option."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag} is not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageError(f"{flag} is nested too deeply") from None


def json_out(obj: Any) -> None:
    sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Table(title=title, show_lines=False)
    for col in columns:
        out.add_column(col, overflow="fold")
    for row in rows:
        out.add_row(*["" if v is None else str(v) for v in row])
    Console(width=160).print(out)


def age(ms: int, now_ms: int | None = None) -> str:
    """How long ago (or from now) an epoch-millisecond time is, for people: "3 s ago"."""
    if not ms:
        return ""
    now = time.time() * 1000 if now_ms is None else now_ms
    delta = (now - ms) / 1000
    later = delta < 0
    delta = abs(delta)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if delta >= size:
            text = f"{delta / size:.0f} {unit}"
            break
    else:
        text = f"{delta:.0f} s"
    return f"in {text}" if later else f"{text} ago"


def local_time(ms: int) -> str:
    """An epoch-millisecond time as local ISO time with its age: "2026-11-29 17:03:04 (3 s
    ago)"; ``--json`` output keeps the milliseconds."""
    if not ms:
        return ""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))
    return f"{stamp} ({age(ms)})"


def client() -> Client:
    return Client(Settings())
