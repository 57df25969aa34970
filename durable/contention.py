"""Optimistic updates of one run's log, written once.

Everything that writes to a run outside its step loop (a cancel, an answer, an approval, a
settle, a release, a child waking its parent, a parent cancelling its children) follows the
same protocol: fold the log, decide what to append from that state, and append it on the
condition that the version folded is still the last one. When another writer got there
first the append is refused (``ConflictError``) and nothing was written; the writer folds
again and decides again, because what it should write may have changed (the run may have
ended, the wait been answered).

``update_run_async`` is that loop, as a coroutine that awaits its Redis calls
(``RedisCalls``): a worker's step protocol awaits it with the worker's own calls
(``workers.redis_io.RedisIO``, batched with the other runs'), so that its driver goes on
with its other runs meanwhile. ``update_run`` is the same loop for a caller on a thread of
its own: it drives the coroutine in place (``durable.log.batching.drive``) with calls made
at once (``InPlace``). The shared routines of ``durable.controls.children``,
``durable.controls.cancellation`` and ``durable.telemetry.liveness`` are written the same way: one
coroutine, driven where a sync caller needs it.

Either gives up after ``attempts`` refusals with one error, ``RunContended(run_id,
attempts)``: the caller's action was not recorded and may be tried again. Each refusal
means another writer made progress, so giving up is rare; it is an error rather than a
quiet ``None`` because the caller asked for something that did not happen.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import redis

from durable.errors import ConflictError, RunContended
from durable.log.batching import drive
from durable.log.store import EventLog, RunHandle

T = TypeVar("T")

ATTEMPTS = 20


class RedisCalls(Protocol):
    """The Redis calls a shared routine awaits: a worker's (``workers.redis_io.RedisIO``),
    or ``InPlace``'s for a caller that drives the routine on its own thread."""

    def load(self, elog: EventLog, run_id: str, *, lease: str = "",
             actor: str = "") -> Awaitable[RunHandle]:
        """``EventLog.load``."""
        ...

    def command(self, *command: Any) -> Awaitable[Any]:
        """One plain command: its reply may be the raw one (a list for ``SMEMBERS``)."""
        ...

    def publish(self, channel: str, message: str) -> Awaitable[None]: ...

    def elsewhere(self, fn: Callable[[], T]) -> Awaitable[T]:
        """``fn``, library code making Redis calls of its own, where it may block."""
        ...


class InPlace:
    """``RedisCalls`` made at once, on the caller's thread: a routine awaiting them yields
    nothing but the log's batched script calls, and ``drive`` runs it to its end.

    ``load(run_id, actor)``: fold with this instead of ``elog.load`` (a caller that
    quarantines an unreadable log on the way)."""

    def __init__(self, client: redis.Redis,
                 load: Callable[[str, str], RunHandle] | None = None) -> None:
        self.redis = client
        self._load = load

    async def load(self, elog: EventLog, run_id: str, *, lease: str = "",
                   actor: str = "") -> RunHandle:
        if self._load is not None:
            return self._load(run_id, actor)
        return elog.load(run_id, lease=lease, actor=actor)

    async def command(self, *command: Any) -> Any:
        return self.redis.execute_command(*command)

    async def publish(self, channel: str, message: str) -> None:
        self.redis.publish(channel, message)

    async def elsewhere(self, fn: Callable[[], T]) -> T:
        return fn()


async def update_run_async(io: RedisCalls, elog: EventLog, run_id: str, actor: str,
                           write: Callable[[RunHandle], Awaitable[T]], *,
                           attempts: int = ATTEMPTS) -> T:
    """Fold ``run_id`` (``io.load``) and await ``write(handle)``, which decides and commits
    (``EventLog.commit_async``); when the commit meets a newer version (``ConflictError``),
    fold again and call it again.

    ``write`` returns what the caller gets (it may decide to write nothing and return at
    once); any other exception it raises ends the loop. Errors of the fold itself
    (``RunNotFound``, ``DecodeError``) reach the caller too. Raises ``RunContended`` after
    ``attempts`` refused commits."""
    for _ in range(attempts):
        handle = await io.load(elog, run_id, actor=actor)
        try:
            return await write(handle)
        except ConflictError:
            continue
    raise RunContended(run_id, attempts)


def update_run(elog: EventLog, run_id: str, actor: str, write: Callable[[RunHandle], T], *,
               attempts: int = ATTEMPTS,
               load: Callable[[str, str], RunHandle] | None = None) -> T:
    """``update_run_async`` on this thread, with a plain ``write`` (which commits with
    ``EventLog.commit``). ``load(run_id, actor)``: fold with this instead of ``elog.load``
    (a caller that quarantines an unreadable log on the way)."""
    async def write_now(handle: RunHandle) -> T:
        return write(handle)

    return drive(update_run_async(InPlace(elog.redis, load), elog, run_id, actor, write_now,
                                  attempts=attempts))
