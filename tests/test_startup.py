"""What a process imports before it does anything: ``import durable`` loads no other module of
the project and no third-party package; a library command of the CLI leaves the processes'
commands unloaded, and ``durable worker`` loads the worker's group alone. Each check runs in
a fresh interpreter, so that nothing this test process imported counts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys\n"
                          "print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_import_durable_loads_nothing_until_a_name_is_used() -> None:
    """PEP 562: the package alone, then the client's module once ``Client`` is used; RQ only
    once a client enqueues (reading runs, the CLI's read commands, never load it)."""
    bare = loaded_after("import durable")
    assert {m for m in bare if m.startswith("durable.")} == set()
    assert not {"redis", "pydantic", "msgspec", "rq"} & bare
    used = loaded_after("import durable\ndurable.Client")
    assert "durable.client" in used and "redis" in used
    assert "rq" not in used  # the queue is made when a run is first enqueued


@pytest.mark.parametrize(("command", "present", "absent"), [
    ("runs", [], ["durable.workers.cli", "durable.reconciler.cli", "durable.console.cli"]),
    ("worker", ["durable.workers.cli"], ["durable.reconciler.cli", "durable.console.cli",
                                         "durable.workers.runtime"]),
    ("reconcile", ["durable.workers.cli", "durable.reconciler.cli", "durable.console.cli"],
     []),
])
def test_the_cli_loads_the_command_groups_the_command_needs(
    command: str, present: list[str], absent: list[str]
) -> None:
    """``reconcile`` is no group's name: every group is loaded to find it. A worker's command
    is parsed without importing the worker itself (that happens when it runs)."""
    loaded = loaded_after("from durable.cli.main import build_parser\n"
                          f"p = build_parser(command={command!r})\n"
                          f"p.parse_args([{command!r}, *(['RUN'] if {command!r} == "
                          "'reconcile' else [])])")
    assert set(present) <= loaded, sorted(set(present) - loaded)
    assert not set(absent) & loaded, sorted(set(absent) & loaded)


def test_every_command_is_listed_without_a_command() -> None:
    """``durable --help`` (no command yet) lists the processes' commands too."""
    from durable.cli.main import build_parser

    names = build_parser().format_help()
    assert all(name in names for name in ("worker", "reconciler", "console", "runs"))
