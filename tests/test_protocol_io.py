"""The step protocol never blocks its driver: no direct Redis call in its coroutines.

A worker's hub drives every held run from one thread (``workers.hub``); a Redis call made
in place by one run's coroutine stalls all of them. So every Redis call the protocol makes
is awaited (``workers.redis_io``: batched with the other runs' calls), and library code
that makes its own calls runs off the driving thread, inside a function or lambda handed to
an ``Offload``.

This walks the protocol's modules as ``tests/test_layout.py`` walks the import graph: every
module of the worker's package that defines a coroutine (``protocol_modules``: the step
loop, its helpers, the Redis calls they await, the hub that drives them, the tool calls
awaited on the event loop), found in the package itself, not listed by hand. From every
``async def``, through every function they call directly (by name, across the modules),
it fails on

- a method of a Redis client (``x.redis.hincrby(...)``, ``client.get(...)``, a pipeline);
- a method of the event log, the leases, the approver registry or RQ's queue other than
  the ones that make no call or are coroutines (``NON_BLOCKING``);
- a call that is not awaited and is handed a client, the log, the leases, the approver
  registry or the queue (``make_ready(self.redis, ...)``, ``wake_parent(self.log,
  ...)``), but for ``bind`` (which only keeps the log).

Bodies of nested functions and lambdas are not walked: they are what is handed to an
``Offload`` (or returned for one), run by the driver elsewhere.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import durable.workers
from durable.agents import registry
from durable.client import Client
from durable.log import keys
from durable.queue import enqueue_many
from durable.settings import Settings
from durable.testing import wait_for
from durable.workers.hub import RunHub
from durable.workers.loop import StepLoop

#: The worker's package (``workers/``, installed as ``durable.workers``).
WORKERS = Path(next(iter(durable.workers.__path__)))

#: Objects whose methods call Redis: attribute names (``self.log``) and plain names.
CLIENTS = {"redis", "client", "pipe", "pipeline"}
HOLDERS = {"log": "the event log", "elog": "the event log", "leases": "the leases",
           "approvers": "the approver registry", "queue": "RQ's queue"}

#: Methods of those objects that make no Redis call, or are coroutines (then awaited).
NON_BLOCKING = {"stage", "commit_async", "acquire_async", "name", "connection"}

#: Calls that are handed the log but only keep it.
KEEPS = {"bind"}


def _name(node: ast.expr) -> str | None:
    """``x`` for ``x`` and for ``a.b.x`` (a module's ``log`` is its logger: None)."""
    if isinstance(node, ast.Name):
        return None if node.id == "log" else node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _body(fn: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``fn``'s body, not those of nested functions and lambdas."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _awaited(fn: ast.AST) -> set[int]:
    return {id(node.value) for node in _body(fn) if isinstance(node, ast.Await)}


def problems_of(fn: ast.AST) -> list[str]:
    """The direct Redis calls in ``fn``'s own body."""
    found = []
    awaited = _awaited(fn)
    for node in _body(fn):
        if not isinstance(node, ast.Call):
            continue
        func, line = node.func, f"line {node.lineno}: {ast.unparse(node)[:80]}"
        if isinstance(func, ast.Attribute):
            owner = _name(func.value)
            if owner in CLIENTS:
                found.append(f"{line} (a Redis client's method)")
                continue
            if owner in HOLDERS and func.attr not in NON_BLOCKING:
                found.append(f"{line} ({HOLDERS[owner]}: {func.attr} calls Redis)")
                continue
        if id(node) in awaited or _name(func) in KEEPS:
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            held = _name(arg) if isinstance(arg, ast.Name | ast.Attribute) else None
            if held in CLIENTS or held in HOLDERS:
                found.append(f"{line} (handed {ast.unparse(arg)}, not awaited)")
                break
    return found


def blocking_calls(sources: dict[str, str]) -> list[str]:
    """Every direct Redis call reached from a coroutine of ``sources`` (path -> text)."""
    functions: dict[str, list[tuple[str, ast.AST]]] = {}
    starts: list[tuple[str, ast.AST]] = []
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.setdefault(node.name, []).append((path, node))
                if isinstance(node, ast.AsyncFunctionDef):
                    starts.append((path, node))
    seen: set[int] = set()
    found = []
    todo = list(starts)
    while todo:
        path, fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        name = getattr(fn, "name", "?")
        found += [f"{path}: {name}, {p}" for p in problems_of(fn)]
        for node in _body(fn):
            if isinstance(node, ast.Call):
                todo += functions.get(_name(node.func) or "", [])
    return sorted(found)


def defines_a_coroutine(text: str) -> bool:
    return any(isinstance(node, ast.AsyncFunctionDef) for node in ast.walk(ast.parse(text)))


def protocol_modules() -> dict[str, str]:
    """Every module of the worker's package that defines a coroutine (path -> text)."""
    sources = {f"workers/{path.name}": path.read_text()
               for path in sorted(WORKERS.glob("*.py"))}
    return {path: text for path, text in sources.items() if defines_a_coroutine(text)}


def test_no_coroutine_of_the_step_protocol_calls_redis_directly() -> None:
    assert blocking_calls(protocol_modules()) == []


def test_the_walk_reads_every_module_that_holds_a_coroutine() -> None:
    """The set is found, not listed: the step loop and the helpers it hands a
    ``StepContext`` are among it (a package that moved, or a module whose coroutines
    were missed, would make the walk above pass without reading them)."""
    found = protocol_modules()
    helpers = {f"workers/{path.name}" for path in WORKERS.glob("*.py")
               if "ctx: StepContext" in path.read_text()}
    assert "workers/loop.py" in found
    assert helpers and helpers <= set(found)


def test_the_walk_finds_a_direct_call_in_a_coroutine_and_in_what_it_calls() -> None:
    """The check can fail: a blocking call in a coroutine, one in a plain helper it calls,
    and one handed a client, are each found; the same calls inside a lambda given to an
    ``Offload`` are not, nor are awaited ones."""
    source = '''
async def step(self):
    self.redis.hincrby("stats", "x", 1)
    helper(self)
    await self.io.stat("x")
    await Offload("(wait)", lambda: make_ready(self.redis, self.queue, "r"))
    await family.wake_parent(self.io, self.log, None, "w")
    self.log.stage(None, [])
    agent.bind(self.log)

def helper(self):
    self.log.quarantine("r", "why")
    wake_parent(self.log, None, "w")

def never_called_from_a_coroutine(self):
    self.redis.get("k")
'''
    found = blocking_calls({"m.py": source})
    assert [f.split(" (")[0] for f in found] == [
        "m.py: helper, line 12: self.log.quarantine('r', 'why')",
        "m.py: helper, line 13: wake_parent(self.log, None, 'w')",
        "m.py: step, line 3: self.redis.hincrby('stats', 'x', 1)",
    ]


class _Watched:
    """A hub of its own whose driving thread notes every Redis command sent in place
    while it resumes a run's coroutine (``RunHub._resume``), not in its batches."""

    def __init__(self, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
        registry.load("examples.agents,tests.agents.basic")
        self.loop = StepLoop(settings, redis.Redis.from_url(settings.redis.url), registry,
                             "w:io:test")
        self.hub = RunHub(self.loop, 16)
        self.direct: list[str] = []
        self.sent = 0
        resuming = threading.local()
        resume = self.hub._resume

        def resumed(task: Any) -> Any:
            resuming.on = True
            try:
                return resume(task)
            finally:
                resuming.on = False

        def noting(send: Any) -> Any:
            def sent(conn: Any, *args: Any, **kw: Any) -> Any:
                self.sent += 1
                if getattr(resuming, "on", False):
                    self.direct.append(str(args[0]) if args else "pipeline")
                return send(conn, *args, **kw)
            return sent

        monkeypatch.setattr(self.hub, "_resume", resumed)
        monkeypatch.setattr(redis.Redis, "execute_command",
                            noting(redis.Redis.execute_command))
        monkeypatch.setattr(redis.client.Pipeline, "execute",
                            noting(redis.client.Pipeline.execute))


@pytest.fixture()
def watched(settings: Settings, r: redis.Redis, monkeypatch: pytest.MonkeyPatch,
            tmp_path: Path) -> Iterator[_Watched]:
    monkeypatch.setenv("TEST_DB", str(tmp_path / "world.sqlite"))
    monkeypatch.setenv("DURABLE_STEPS_PER_JOB", "2")  # a release and re-queue every 2 steps
    w = _Watched(Settings(), monkeypatch)
    stop = threading.Event()  # the worker's safety net takes the children as they start
    threading.Thread(target=w.hub.slots.poll, args=(0.05, stop), daemon=True).start()
    yield w
    stop.set()
    w.hub.slots.shutdown(5)


def test_the_hub_sends_no_redis_command_in_place_while_it_resumes_runs(
    watched: _Watched, client: Client, r: redis.Redis
) -> None:
    """Forty runs re-queued every two steps (the lease released and the run made ready
    again at each turn end) and a parent with two children (a child read, the parent woken
    by its children's ends): each completes, and no Redis command went out in place from
    a run's coroutine on the driving thread."""
    runs = [run.run_id for run in client.start_many("count", [{"steps": 6}] * 40,
                                                     enqueue=False)]
    parent = client.start("parent", {"children": 2}, enqueue=False).run_id
    enqueue_many(r, client.log.keys, client.queue, [*runs, parent])
    assert wait_for(lambda: all(client.status(run).state == "completed"
                                for run in [*runs, parent]), 60)
    assert watched.hub.slots.wait_idle(10)
    assert watched.sent > 0  # the watch sees what is sent in place (the test's own reads)
    assert watched.direct == []


def test_the_watch_sees_a_call_made_in_place(
    watched: _Watched, client: Client, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check can fail: a statistic counted with a direct call, as the protocol once
    counted a malformed command, is seen."""
    loop = watched.loop

    async def in_place(name: str, amount: int = 1) -> None:
        loop.redis.hincrby(keys.STATS, name, amount)

    monkeypatch.setattr(loop.io, "stat", in_place)
    assert watched.hub.slots.take_again("not a run id!")
    assert wait_for(lambda: client.stats().get("malformed_commands") == 1, 10)
    assert watched.direct == ["HINCRBY"]


def test_a_run_whose_step_code_raises_is_counted_in_a_batch(
    watched: _Watched, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose step code raises (a bug, not a Redis fault) is counted among the
    worker's statistics in the hub's next batch: the driving thread, which resumes every
    other run, sends nothing in place for it."""
    async def raises(run_id: str, callbacks: Any) -> dict[str, Any]:
        raise RuntimeError(f"a bug met driving {run_id}")

    monkeypatch.setattr(watched.loop, "advance_async", raises)
    assert watched.hub.slots.take_again("r-raises")
    assert wait_for(lambda: client.stats().get("advance_errors") == 1, 10)
    assert watched.hub.slots.wait_idle(10)
    assert watched.direct == []
