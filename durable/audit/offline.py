"""A saved run is a test: its log, read from a file, replayed against the agent code
imported now, with no model, no tool and no Redis (``durable replay-test``,
``durable.testing.replay_file``).

A saved run is what ``durable export RUN --saved`` writes (JSON lines; the first names the
format and its version: ``{"kind": "format", "format": "durable-run", "version": 1}``), an
archive of ``durable archive`` (the same lines, gzip), or a file of plain event lines (a
known-good log kept as a fixture). Each event is decoded from its bytes when the file keeps
them (``raw``), else from its readable fields; sealed fields are opened with the keys of the
environment (``DURABLE_ENCRYPTION_KEYS``) and a value kept beside the run is read from the
file's ``blob`` lines, checked against its digest.

- a ``decide(state)`` agent re-decides every recorded step from the state before it, and a
  completed run must be finished by the agent where the log finishes it;
- a code agent's function (the integrations' too: pydantic-ai, the OpenAI Agents SDK and
  LangGraph each register a code agent) is executed from the start, every step it takes
  answered by its recorded outcome. The first step whose tool or arguments differ (a model
  step's: the digest of its request) fails the replay, naming the step and what differs;
  so does a function that ends before the log does, takes a step past a completed run's
  end, or returns another result than the one the log records.

Nothing is sent and nothing is written: a replay is a pure function of the file and the
code.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from durable.agents import Agent, Call, Cancel, Fail, Finish, Parallel, Registry, Wait, registry
from durable.audit.archives import read_lines
from durable.audit.replay import redecide
from durable.code import CodeAgent
from durable.code.history import history_of
from durable.errors import DecodeError, NondeterminismError, UsageError
from durable.log import blobs
from durable.log import events as ev
from durable.log.entries import decode_entry, open_entry
from durable.log.export import FORMAT, VERSION
from durable.log.fold import apply, fold
from durable.log.state import Action, RunState
from durable.log.store import Entry
from durable.security.sealing import Keyring, settings_keyring
from durable.settings import Settings

#: Longest a code agent's function may take to get through its recorded steps (s).
TIMEOUT_S = 30.0

#: The fields of an event line that are not the event's own.
_LINE_FIELDS = ("kind", "id", "raw", "h")


class SavedRunDiverged(NondeterminismError):
    """A saved run replayed offline: the agent code takes another step than the file
    records (``step`` names the first; 0 when it is the run's end)."""

    def __init__(self, path: str, run_id: str, step: int, detail: str) -> None:
        self.path = path
        NondeterminismError.__init__(self, run_id, step, "", "", detail)
        self.args = (f"{path}: run {run_id} " + (f"step {step}" if step else "its end") +
                     f": {detail}",)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class SavedRun:
    """A run's events and large values, read from a file."""

    path: str
    run_id: str
    agent: str
    events: list[ev.Event]
    #: Large values by field: their bytes as stored (sealed fields sealed).
    blobs: dict[str, bytes] = field(default_factory=dict)
    version: int = 0
    #: The keys its sealed fields were opened with (its large values are opened with them).
    keyring: Keyring = field(default_factory=lambda: Keyring({}, None))


@dataclass
class Replayed:
    """The verdict of one saved run: ``same`` or ``diverges`` at ``step``."""

    path: str
    run_id: str
    agent: str
    outcome: str
    #: Steps the log records, and the first that differs (0: none, or the run's end).
    steps: int
    step: int = 0
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome == "same"

    def check(self) -> Replayed:
        """Itself when the code takes the recorded steps, else ``SavedRunDiverged``."""
        if not self.ok:
            raise SavedRunDiverged(self.path, self.run_id, self.step, self.detail)
        return self


def load(path: Path | str, keyring: Keyring | None = None) -> SavedRun:
    """The saved run at ``path`` (plain or gzip JSON lines), its sealed fields opened with
    ``keyring`` (default: the environment's keys). A ``UsageError`` names what cannot be
    read: a newer format, an entry that does not decode, a sealed field without its key."""
    where = str(path)
    lines = read_lines(Path(path))
    head = next((line for line in lines if line.get("kind") == "format"), None)
    version = int(head.get("version", 0)) if head else 0
    if head is not None and (head.get("format") != FORMAT or version > VERSION):
        raise UsageError(f"{where}: format {head.get('format')!r} version {version}; this "
                         f"version of durable reads {FORMAT!r} up to version {VERSION}")
    keys = keyring if keyring is not None else settings_keyring(Settings())
    events: list[ev.Event] = []
    actor = ""
    for line in lines:
        if line.get("kind", "event") != "event" or "type" not in line or \
                (line["type"] == "checkpoint" and "raw" not in line):
            continue  # a checkpoint is derived: its readable form is not decoded back
        entry = _entry(where, line, actor)
        if entry.event is not None:
            actor = entry.event.actor
        opened = open_entry(entry, None, keys, set())
        if opened.event is None:
            raise UsageError(f"{where}: entry {entry.id or len(events) + 1}: "
                             f"{opened.error} (a sealed field needs its key in "
                             "DURABLE_ENCRYPTION_KEYS)")
        events.append(opened.event)
    if not events or not isinstance(events[0], ev.RunStarted):
        raise UsageError(f"{where}: not a saved run (its first event is not run_started)")
    stored = {str(line["field"]): str(line.get("data", "")).encode()
              for line in lines if line.get("kind") == "blob"}
    return SavedRun(where, events[0].run, events[0].agent, events, stored, version, keys)


def _entry(where: str, line: dict[str, Any], actor: str) -> Entry:
    entry_id = str(line.get("id", ""))
    if "raw" in line:  # the entry's own bytes: what the log holds, chained
        try:
            fields = {b"e": base64.b64decode(str(line["raw"]), validate=True)}
        except (binascii.Error, ValueError):
            raise UsageError(f"{where}: entry {entry_id}: its bytes are not base64") from None
        entry = decode_entry(entry_id, fields, str(line.get("run", "")), actor)
    else:
        data = {k: v for k, v in line.items() if k not in _LINE_FIELDS}
        try:
            entry = Entry(entry_id, ev.from_builtins(data))
        except (DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
            entry = Entry(entry_id, None, str(exc))
    if entry.event is None:
        raise UsageError(f"{where}: entry {entry_id or line.get('seq')} does not decode: "
                         f"{entry.error}")
    return entry


def replay_saved(saved: SavedRun, agent: Agent | None = None, *,
                 tools: Registry = registry, timeout_s: float = TIMEOUT_S) -> Replayed:
    """Replay ``saved`` against ``agent`` (default: the registered agent of its name)."""
    agent = agent if agent is not None else tools.agent(saved.agent)
    began = time.perf_counter()
    folded = fold(saved.events, window=ALL)
    try:
        if isinstance(agent, CodeAgent):
            step, detail = _code(saved, agent, folded, timeout_s)
        else:
            step, detail = _decided(saved, agent)
    except NondeterminismError as exc:
        step, detail = exc.step, str(exc.detail or exc)
        if not exc.detail:
            step, detail = exc.step, f"the log records {exc.recorded}, the agent now " \
                                     f"decides {exc.decided}"
    except DecodeError as exc:
        raise UsageError(f"{saved.path}: {exc}") from None
    seconds = time.perf_counter() - began
    outcome = "diverges" if detail else "same"
    return Replayed(saved.path, saved.run_id, agent.name, outcome, folded.step, step,
                    detail, seconds)


#: Every action is kept when a saved run is folded (no window).
ALL = 1 << 62


def _code(saved: SavedRun, agent: CodeAgent, state: RunState, timeout_s: float
          ) -> tuple[int, str]:
    actions, waits, values = history_of(saved.events)
    _resolve(saved, actions.values(), [state])
    try:
        decision, taken = agent.dry_run(state, timeout_s, history=(actions, waits, values))
    except (NondeterminismError, DecodeError):
        raise
    except TimeoutError as exc:
        return state.step + 1, f"the function {exc}"
    except Exception as exc:  # the code raises on this run's history
        return 0, f"the function raised {exc!r}"
    return _ending(state, decision, taken)


def _ending(state: RunState, decision: Any, taken: int) -> tuple[int, str]:
    """What the decision past the recorded steps says of the code against the log."""
    ends = isinstance(decision, Finish | Fail | Cancel)
    if ends and taken < state.step:
        return taken + 1, f"the function ends after step {taken}; the log records " \
                          f"{state.step} steps"
    if state.state != "completed":
        return 0, ""  # in flight, failed, canceled: what comes next is not recorded
    if isinstance(decision, Call | Parallel) and taken > state.step:
        call = decision if isinstance(decision, Call) else decision.calls[0]
        return taken, f"the function takes step {taken} ({call.tool}) past the log's " \
                      f"end: the run completed after {state.step} steps"
    if isinstance(decision, Wait):
        return 0, f"the function waits ({decision.kind}) where the run completed"
    if not isinstance(decision, Finish):
        return 0, f"the function ends {type(decision).__name__.lower()} " \
                  f"({getattr(decision, 'error', '')}) where the run completed"
    now, was = _canonical(decision.result), _canonical(state.result)
    if now != was:
        return 0, f"the function returns {_clip(now)}; the log records {_clip(was)}"
    return 0, ""


def _decided(saved: SavedRun, agent: Agent) -> tuple[int, str]:
    """Re-decide every recorded step (and a completed run's end) from the state before."""
    state = RunState()
    window = Settings().log.action_window
    for event in saved.events:
        if isinstance(event, ev.StepDecided) and event.group in (0, event.step):
            redecide(saved.run_id, agent, state, event.step, event.tool, event.args,
                     event.group)
        elif isinstance(event, ev.Completed):
            decision = agent.decide(state)
            found = _ending(_completed(state, event), decision, state.step)
            if found[1]:
                return found
        apply(state, event, window)
        if blobs.ref_of(event) is not None:  # the agent reads values kept beside the run
            _resolve(saved, state.actions.values(), [state])
    return 0, ""


def _completed(state: RunState, event: ev.Completed) -> RunState:
    done = msgspec.structs.replace(state, state="completed")
    done.result = event.result
    return done


def _resolve(saved: SavedRun, actions: Iterable[Action], states: Iterable[RunState]) -> None:
    """Fill in the values kept beside the run from the file's ``blob`` lines."""
    keyring = saved.keyring
    for act in actions:
        if act.blob is not None and act.result is None and not act.trimmed:
            act.result = blobs.value_of(act.blob, saved.blobs.get(act.blob.field), keyring,
                                        None, act.step)
    for state in states:
        if state.input_blob is not None and state.input is None:
            state.input = blobs.value_of(state.input_blob,
                                         saved.blobs.get(state.input_blob.field), keyring)


def _canonical(value: Any) -> str:
    try:
        return msgspec.json.encode(msgspec.json.decode(msgspec.json.encode(value)),
                                   order="sorted").decode()
    except (TypeError, msgspec.EncodeError):
        return repr(value)


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
