"""What the step protocol's helpers are given: a ``StepContext``.

The step loop (``workers.loop.StepLoop``) drives a held run; what a job checks before its
first step (``workers.admission``), what a decision leads to (``workers.decisions``), the
checks against the approver registry (``workers.authority``) and the user code awaited on
the event loop (``workers.aio``) are coroutines of the same protocol, written as functions
of this interface rather than of the loop: they see the run's collaborators (read only)
and the few things the loop does for them, and nothing else of it. ``StepLoop`` satisfies
it; a test can hand them anything else that does.

Like the loop's own coroutines, the helpers make no Redis call in place: every call is
awaited (``io``, ``log.commit_async``) and so is all user code (``user``, ``Offload``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis

from durable.agents import Agent, Registry
from durable.controls.approvers import Approvers
from durable.flow.limits import Limiter
from durable.leases import Lease
from durable.log.store import EventLog, RunHandle, Spec
from durable.settings import Settings

from .dispatch import Dispatcher
from .hooks import StepHooks
from .redis_io import RedisIO
from .turns import Offload, Outside


class StepContext(Protocol):
    """The step loop as its helpers see it: the worker's collaborators, and what the loop
    does on their behalf (commit, quarantine, reload, park, wake, time user code, let go
    of a lease)."""

    # The worker's collaborators: read, never replaced ------------------------------------

    @property
    def settings(self) -> Settings: ...

    @property
    def worker_id(self) -> str:
        """The actor of what the worker writes."""
        ...

    @property
    def registry(self) -> Registry:
        """The agents and tools this worker serves."""
        ...

    @property
    def log(self) -> EventLog:
        """The event log: staging (``stage``) makes no call; commits are awaited."""
        ...

    @property
    def io(self) -> RedisIO:
        """Every Redis call of the protocol's coroutines (``workers.redis_io``)."""
        ...

    @property
    def redis(self) -> redis.Redis:
        """The client handed to library code that runs off the driving thread (a tool's
        ``lookup``), never called in place."""
        ...

    @property
    def hooks(self) -> StepHooks:
        """The crash windows, metrics and tracing around each step (``workers.hooks``)."""
        ...

    @property
    def limiter(self) -> Limiter:
        """Flow control shared by every worker (``durable.flow.limits``)."""
        ...

    @property
    def approvers(self) -> Approvers:
        """The approver registry a recorded decision is checked against."""
        ...

    @property
    def dispatcher(self) -> Dispatcher:
        """Calls a tool once (``workers.dispatch``)."""
        ...

    def configuration(self, agent: Agent) -> dict[str, str]:
        """The configuration this worker runs ``agent`` under (``Agent.configuration``,
        made once per process): what a run's pin is compared with on every job."""
        ...

    # What the loop does for its helpers ---------------------------------------------------

    async def commit(self, handle: RunHandle, pending: list[Spec], specs: list[Spec],
                     **kw: Any) -> None:
        """Commit what is staged plus ``specs``; ``pending`` is emptied once in the log."""
        ...

    async def quarantine(self, handle: RunHandle, reason: str, traceback: str = "",
                         counts: Sequence[tuple[str, int]] = ()) -> None:
        """Drop what is staged and quarantine the run, naming ``reason``; ``counts``
        (``durable.log.counters``) are added with its event."""
        ...

    async def load(self, run_id: str, lease: Lease, version: int | None = None,
                   raw: Any = None) -> RunHandle | None:
        """The run folded again; None when it is gone or unreadable (then quarantined)."""
        ...

    async def park(self, run_id: str, wait: Any) -> None:
        """The run waits for a limit (``durable.flow.limits``): the worker lets go of it."""
        ...

    async def woke(self, parent: str | None) -> None:
        """Make a parent whose wait for a child was just resolved ready again."""
        ...

    async def let_go(self, lease: Lease) -> None:
        """Release the job's ``lease`` before the job ends (its run goes elsewhere): the
        job's end does not release it again."""
        ...

    def user(self, what: str, fn: Callable[[], Any]) -> Offload:
        """Agent code ``fn``, to ``await``: timed by the watchdog."""
        ...

    def outside(self) -> Outside:
        """This thread waits on user code, a tool, or a deadline: its turn is given back."""
        ...
