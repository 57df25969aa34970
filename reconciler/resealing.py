"""Sealing the runs whose seal was lost: a reconciler with a seal key (``DURABLE_SEAL_KEY``,
``DURABLE_SEAL_SIGNER``) seals, on each sweep, the runs that ended without one.

The process that ends a run seals its log's chain head one round trip after the terminal
append (``durable.log.chain.seal_call``): one that dies in between, or loses Redis then, or
had no seal key, leaves the run "unsealed (chain only)" in ``verify``. The reconciler looks
at the runs that entered a terminal state since its last look (the per-state indexes, by
shard, a cursor each: a look is bounded however many runs ended), and seals each one still
without a seal once it has been terminal for ``GRACE_MS`` (its own process had its chance),
after checking its chain as ``durable seal`` does. A log that does not chain is never
sealed: it is reported, once, as the tampering ``verify`` will name. Two reconcilers may seal
the same run: both seals cover the same head, and the script keeps one.
"""

from __future__ import annotations

import logging

from durable.audit.seals import seal_with, unsealed_ended
from durable.controls.approvers import Approvers
from durable.errors import Refused, RunNotFound
from durable.log import keys
from durable.log.state import TERMINAL
from durable.log.store import EventLog

log = logging.getLogger("durable.reconciler")

#: How long (ms) a run has been terminal before a reconciler seals it in its ender's place.
GRACE_MS = 5_000

#: How far back (ms) a reconciler that just started looks for runs that ended unsealed.
LOOKBACK_MS = 24 * 3_600_000

#: Runs looked at per terminal state and shard in one sweep.
BATCH = 200


class Resealer:
    """The sealing sweep of one reconciler (``sweep`` from its tick); it does nothing
    without a seal key."""

    def __init__(self, elog: EventLog, approvers: Approvers) -> None:
        self.elog = elog
        self.approvers = approvers
        #: Where the next look starts, per (terminal state, shard).
        self.cursors: dict[tuple[str, int | None], float] = {}
        #: Runs refused once (a log that does not chain): reported once, not retried.
        self.refused: set[str] = set()

    def sweep(self, now: int) -> dict[str, str]:
        """Seal the runs that ended unsealed since the last sweep; what was done, by run."""
        sealer = self.elog.sealer
        if sealer is None:
            return {}
        done: dict[str, str] = {}
        until = now - GRACE_MS
        for state in sorted(TERMINAL):
            for shard in self.elog.keys.shard_ids():
                since = self.cursors.get((state, shard), now - LOOKBACK_MS)
                ids, self.cursors[(state, shard)] = unsealed_ended(
                    self.elog, state, shard, since, until, BATCH)
                for run_id in ids:
                    if run_id not in self.refused:
                        done[run_id] = self._seal(run_id)
        sealed = sum(1 for what in done.values() if what == "sealed")
        if sealed:
            self.elog.redis.hincrby(keys.STATS, "runs_sealed_by_reconciler", sealed)
        return done

    def _seal(self, run_id: str) -> str:
        assert self.elog.sealer is not None
        try:
            if seal_with(self.elog, self.approvers, run_id, self.elog.sealer) is None:
                return "moved on"  # appended to as it was sealed: indexed again, seen again
        except RunNotFound:
            return "gone"  # expired (retention) since it was indexed
        except Refused as exc:
            self.refused.add(run_id)
            log.error("run %s ended unsealed and is not sealed: %s", run_id, exc.reason)
            return f"refused: {exc.reason}"
        log.info("run %s ended unsealed: sealed by %s", run_id, self.elog.sealer.signer)
        return "sealed"
