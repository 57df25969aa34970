"""What every command shares: exit codes, output for people and for scripts, the client."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from durable.client import Client
from durable.settings import Settings

OK, CHECK_FAILED, USAGE, UNAVAILABLE = 0, 1, 2, 3

#: ``add(name, fn, help, run=False, js=True)``: how a module adds its subcommands.
Add = Callable[..., argparse.ArgumentParser]


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 on usage errors, as we want
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"durable: error: {message}\n")


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


def client() -> Client:
    return Client(Settings())
