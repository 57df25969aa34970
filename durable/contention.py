"""Optimistic updates of one run's log, written once.

Everything outside a worker that writes to a run (a cancel, an answer, an approval, a settle,
a release, a child waking its parent) follows the same protocol: fold the log, decide what to
append from that state, and append it on the condition that the version folded is still the
last one. When another writer got there first the append is refused (``ConflictError``)
and nothing was written; the writer folds again and decides again, because what it should
write may have changed (the run may have ended, the wait been answered).

``update_run`` is that loop. It gives up after ``attempts`` refusals with one error,
``RunContended(run_id, attempts)``: the caller's action was not recorded and may be tried
again. Each refusal means another writer made progress, so giving up is rare; it is an
error rather than a quiet ``None`` because the caller asked for something that did not
happen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from durable.errors import ConflictError, RunContended
from durable.log.store import EventLog, RunHandle

T = TypeVar("T")

ATTEMPTS = 20


def update_run(elog: EventLog, run_id: str, actor: str, write: Callable[[RunHandle], T], *,
               attempts: int = ATTEMPTS,
               load: Callable[[str, str], RunHandle] | None = None) -> T:
    """Fold ``run_id`` and call ``write(handle)``, which decides and commits; when the commit
    meets a newer version (``ConflictError``), fold again and call it again.

    ``write`` returns what the caller gets (it may decide to write nothing and return at
    once); any other exception it raises ends the loop. Errors of the fold itself
    (``RunNotFound``, ``DecodeError``) reach the caller too. Raises ``RunContended`` after
    ``attempts`` refused commits. ``load(run_id, actor)``: fold with this instead of
    ``elog.load`` (a caller that quarantines an unreadable log on the way)."""
    for _ in range(attempts):
        handle = load(run_id, actor) if load else elog.load(run_id, actor=actor)
        try:
            return write(handle)
        except ConflictError:
            continue
    raise RunContended(run_id, attempts)
