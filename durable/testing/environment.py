"""An agent or a tool under test, run in this process against a real Redis server, with a
clock the test moves (as Temporal's ``WorkflowEnvironment.start_time_skipping()`` and
``ActivityEnvironment`` do).

``AgentEnvironment`` starts the embedded server on a random port (or uses ``url``), reads
a ``TestClock`` for every time the library records (``durable.clock``), and drives runs
with the worker's own step protocol and the reconciler's own sweep, on the calling thread:
what a test sees is what a deployment writes, without processes or waiting::

    with AgentEnvironment("myapp.agents") as env:
        run = env.start("reminder", {"in_s": 3600})
        assert env.status(run).state == "waiting_timer"
        env.advance(3600)                      # the timer is due: woken, driven on
        assert env.status(run).state == "completed"

The step driver and the sweep come from the processes' packages through the
``durable.testing`` entry point group (``worker``, ``reconciler``), as the CLI finds their
commands: the library does not import its processes.
"""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol

import redis

from durable import clock
from durable.agents import Lookup, registry, resolve_awaitable
from durable.client import Client
from durable.log import keys
from durable.log.state import RunState
from durable.settings import Settings
from durable.testing.server import Server

#: Where the processes' packages name their in-process parts.
GROUP = "durable.testing"


class TestClock:
    """A wall clock that moves only when told to (``advance``); it starts at ``start``
    (seconds since the epoch; the real time by default) and never goes back."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else float(start)
        self._lock = threading.Lock()

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` (>= 0) forward; returns the new time."""
        if not seconds >= 0:
            raise ValueError(f"a clock moves forward only, not by {seconds!r} s")
        with self._lock:
            self._now += seconds
            return self._now


@dataclass
class ToolOutcome:
    """What one call of a tool recorded: ``outcome`` is the event's type
    (``action_succeeded``, ``action_failed``, ``action_timed_out``, ``action_interrupted``,
    ``call_canceled``), ``result`` its value, ``error`` its error; ``fields`` all of it."""

    outcome: str
    result: Any = None
    error: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)


class StepDriver(Protocol):
    """The worker's part (entry point ``worker``): drives one ready run on this thread."""

    def advance(self, run_id: str) -> bool:
        """Drive ``run_id`` until it needs no worker; True when it is ready again."""
        ...

    def call_tool(self, tool: str, args: dict[str, Any], *, run_id: str, step: int,
                  key: str, deadline_ms: int, attempt: int) -> tuple[str, dict[str, Any]]:
        """One call of ``tool`` as a worker dispatches it: (event type, its fields)."""
        ...

    def close(self) -> None: ...


class Sweep(Protocol):
    """The reconciler's part (entry point ``reconciler``): one sweep of what is due."""

    def tick(self, now: int) -> dict[str, str]:
        """Do what every run due at ``now`` (ms) needs; returns run id -> what was done."""
        ...


def _part(name: str) -> Any:
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        raise RuntimeError(f"no {name!r} entry point in group {GROUP!r}: is the project "
                           "installed (pip install -e .)?")
    return found[0].load()


class AgentEnvironment:
    """Runs ``agents`` (a comma-separated list of modules, as ``DURABLE_AGENTS``) in this
    process on a real Redis server: the embedded one on a random port, or ``url``. The
    ``clock`` (a ``TestClock`` starting now, by default) is read for every recorded time
    while the environment is open; ``settings`` are ``Settings`` fields
    (``lease_ttl_ms=1000``...)."""

    def __init__(self, agents: str, *, url: str | None = None, clock: TestClock | None = None,
                 **settings: Any) -> None:
        self.agents = agents
        self.clock = clock or TestClock()
        self._url = url
        self._overrides = settings
        self._stack = ExitStack()
        self.server: Server | None = None
        self.worker_id = f"test:{uuid.uuid4().hex[:6]}"

    # Lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> AgentEnvironment:
        try:
            url = self._url
            if url is None:
                self.server = self._stack.enter_context(Server(fsync="everysec"))
                url = self.server.url
            self.settings = Settings.from_env(redis_url=url, agents=self.agents,
                                              **self._overrides)
            registry.load(self.agents)
            self.redis = redis.Redis.from_url(url)
            self._stack.callback(self.redis.close)
            self._stack.enter_context(clock.using(self.clock))
            self.client = Client(self.settings, self.redis)
            self._stack.callback(self.client.close)
            self.driver: StepDriver = _part("worker")(self.settings, self.redis, registry,
                                                      self.worker_id)
            self._stack.callback(self.driver.close)
            self.sweep: Sweep = _part("reconciler")(self.settings, self.redis, registry)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    # Agents ---------------------------------------------------------------------------

    def start(self, agent: str, input: Any = None, run_id: str | None = None,
              **options: Any) -> str:
        """Start a run (``Client.start``'s options) and drive it as far as it goes now;
        returns its id."""
        started = self.client.start(agent, input, run_id, **options).run_id
        self.drain()
        return started

    def execute(self, agent: str, input: Any = None, run_id: str | None = None,
                **options: Any) -> RunState:
        """``start``, then the run's state (terminal, or waiting for what comes next)."""
        return self.status(self.start(agent, input, run_id, **options))

    def status(self, run_id: str) -> RunState:
        return self.client.status(run_id)

    def drain(self, limit: int = 10_000) -> int:
        """Drive every ready run (the ones made ready meanwhile too) until none is left;
        returns how many turns were driven."""
        turns = 0
        while turns < limit:
            ready = self._pop_ready()
            if ready is None:
                return turns
            turns += 1
            if self.driver.advance(ready):
                continue  # made ready again: popped on a later turn
        raise RuntimeError(f"runs were still ready after {limit} turns (an agent that "
                           "never stops?)")

    def advance(self, seconds: float) -> dict[str, str]:
        """Move the clock ``seconds`` on: every lease and worker liveness key ages as much
        (those that expire are gone), the reconciler's sweep does what is due by then
        (timers woken, waits expired, runs whose lease expired taken back), and every run
        made ready is driven. Returns what the sweeps did, run id -> action."""
        self.clock.advance(seconds)
        self._age_keys(int(seconds * 1000))
        done: dict[str, str] = {}
        for _ in range(100):  # until nothing more is due now
            actions = self.sweep.tick(clock.now_ms())
            self.drain()
            fresh = {run: what for run, what in actions.items() if done.get(run) != what}
            if not fresh:
                break
            done.update(fresh)
        return done

    # Tools ----------------------------------------------------------------------------

    def call_tool(self, tool: str, args: dict[str, Any] | None = None, *,
                  key: str | None = None, attempt: int = 1, run_id: str = "tool-test",
                  step: int = 1) -> ToolOutcome:
        """Call ``tool`` once as a worker would (its deadline from its ``timeout_s``, its
        quick retries, cancel token and outcome rules) with ``key`` (a fresh one by
        default); returns what the worker would record."""
        timeout_ms = int(registry.tool(tool).timeout_s * 1000)
        tag, fields = self.driver.call_tool(
            tool, dict(args or {}), run_id=run_id, step=step,
            key=key or f"{run_id}:{uuid.uuid4().hex[:8]}", deadline_ms=clock.now_ms()
            + timeout_ms, attempt=attempt)
        return ToolOutcome(tag, fields.get("result"), fields.get("error"), fields)

    def lookup(self, tool: str, key: str, args: dict[str, Any] | None = None) -> Lookup:
        """Ask ``tool`` whether the effect of ``key`` happened, as recovery asks it."""
        result: Lookup = resolve_awaitable(registry.tool(tool).lookup(key, dict(args or {})))
        return result

    # Helpers --------------------------------------------------------------------------

    def _pop_ready(self) -> str | None:
        queue = self.client.queue
        routes = [b"", *sorted(queue.connection.smembers(keys.routes(queue.name)))]
        for route in routes:
            name = route.decode() if isinstance(route, bytes) else str(route)
            popped = queue.connection.lpop(keys.ready(queue.name, name))
            if popped is not None:
                return popped.decode() if isinstance(popped, bytes) else str(popped)
        return None

    def _age_keys(self, ms: int) -> None:
        """Leases and worker liveness keys are counted down by Redis: shorten them by
        ``ms``, and delete those that would have expired."""
        for pattern in (f"{keys.PREFIX}:*:lease", keys.alive("*")):
            for key in self.redis.scan_iter(match=pattern, count=500):
                left = int(self.redis.pttl(key))
                if left < 0:
                    continue  # no time to live (or gone meanwhile)
                if left <= ms:
                    self.redis.delete(key)
                else:
                    self.redis.pexpire(key, left - ms)
