"""``append.lua``'s header is its contract, and ``AppendCall`` is that header in Python:
the same KEYS, ARGV and variable-length groups in the same order. The shared constants
(terminal states) are rendered into the scripts from one Python source."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import redis

from durable.log import events as ev
from durable.log.append import AppendCall, prepare
from durable.log.keys import KeyLayout
from durable.log.scripts import source
from durable.log.state import TERMINAL, RunState
from durable.log.store import EventLog, RunHandle, Spec

SCRIPTS = Path(__file__).resolve().parent.parent / "durable" / "log" / "scripts"


def header(name: str) -> tuple[list[str], list[str], list[tuple[str, int]]]:
    """The KEYS, the ARGV (in index order, checked to be 1, 2, 3...) and the groups (name,
    ARGV per item) that a script's opening comment declares."""
    text = (SCRIPTS / f"{name}.lua").read_text()
    declared: dict[str, list[tuple[int, str]]] = {"KEYS": [], "ARGV": []}
    for kind, index, field in re.findall(r"^-- (KEYS|ARGV)\[(\d+)\]\s+(\w+)", text, re.M):
        declared[kind].append((int(index), field))
    groups = [(g, int(n)) for g, n in re.findall(r"^-- GROUP (\w+)\s+(\d+)\s", text, re.M)]
    for kind, found in declared.items():
        assert [i for i, _ in found] == list(range(1, len(found) + 1)), (kind, found)
    return [f for _, f in declared["KEYS"]], [f for _, f in declared["ARGV"]], groups


def test_append_call_fields_are_the_script_header_in_order() -> None:
    script_keys, script_args, groups = header("append")
    parts: dict[str, list[str]] = {"key": [], "arg": [], "group": []}
    for f in fields(AppendCall):
        parts["arg" if f.metadata["part"] == "count" else f.metadata["part"]].append(f.name)
    assert parts["key"] == script_keys
    assert parts["arg"] == script_args
    assert parts["group"] == [g for g, _ in groups]


def test_every_count_argument_counts_a_declared_group() -> None:
    _, _, groups = header("append")
    counted = {f.metadata["of"] for f in fields(AppendCall) if f.metadata["part"] == "count"}
    assert counted == {g for g, _ in groups}


def test_a_built_call_lays_its_groups_out_as_the_header_says(layout: KeyLayout,
                                                             r: redis.Redis) -> None:
    """A real batch: the ARGV list has one value per scalar, then each group's items
    flattened with the header's width, and the script accepts it."""
    _, script_args, groups = header("append")
    elog = EventLog(r, layout=layout)
    handle = RunHandle("typed", RunState(), actor="test")
    specs = [Spec(ev.RunStarted, {"agent": "a", "tools": []}),
             Spec(ev.Completed, {"result": 1})]
    prepared = prepare(elog, handle, specs, {"extra": {"agent": "a"}})
    call = prepared.call
    args = call.args
    assert len(call.keys) == 12 and call.keys[0] == layout.log("typed")
    width = dict(groups)
    expected = len(script_args) + sum(width[g] * len(getattr(call, g)) for g in width)
    assert len(args) == expected and call.n == 2 and call.nextra == len(call.extras)
    assert ("agent", "a") in call.extras
    assert args[len(script_args):len(script_args) + 2] == list(call.events[0])
    reply = elog.scripts.append(keys=call.keys, args=args)
    assert reply[0] == b"ok" and int(reply[1]) == 2


def test_terminal_states_are_rendered_into_the_scripts_from_one_source() -> None:
    """No script spells the terminal states itself; each gets them from
    ``durable.log.state.TERMINAL``."""
    for name in ("append", "archive_delete"):
        raw = (SCRIPTS / f"{name}.lua").read_text()
        assert "{--[[TERMINAL]]}" in raw
        assert not any(f"{state} = true" in raw for state in TERMINAL)
        rendered = source(name)
        assert "--[[TERMINAL]]" not in rendered
        line = next(x for x in rendered.splitlines() if x.startswith("local TERMINAL"))
        assert sorted(re.findall(r"(\w+) = true", line)) == sorted(TERMINAL)
    for path in SCRIPTS.glob("*.lua"):
        assert "completed = true" not in path.read_text(), path.name
