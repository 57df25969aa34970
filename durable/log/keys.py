"""Every Redis key and channel the system uses, in one place.

Per-run keys carry the hash tag ``{run_id}`` so that one Lua script can touch all of them
atomically and the layout works unchanged on Redis Cluster. Global keys are derived data:
they can be rebuilt from the run logs (``durable repair-index``).
"""

from __future__ import annotations

import re

PREFIX = "dx"

#: run ids are short, printable and safe inside a hash tag (no braces).
RUN_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def log(run_id: str) -> str:
    """Stream: the run's append-only log. Never trimmed while the run lives."""
    return f"{PREFIX}:{{{run_id}}}:log"


def run(run_id: str) -> str:
    """Hash: cached projection (state, version, step, last entry id, checkpoint id, due)."""
    return f"{PREFIX}:{{{run_id}}}:run"


def ledger(run_id: str) -> str:
    """Hash: idempotency key -> ``claimed|<deadline ms>`` or ``done|<outcome>``."""
    return f"{PREFIX}:{{{run_id}}}:fx"


def lease(run_id: str) -> str:
    """String ``<owner token>|<epoch>`` with a PX time to live (ms). Not business state."""
    return f"{PREFIX}:{{{run_id}}}:lease"


def fence(run_id: str) -> str:
    """Integer: the fencing epoch, incremented on every lease acquisition."""
    return f"{PREFIX}:{{{run_id}}}:fence"


def queued(run_id: str) -> str:
    """String with PX TTL (ms): an ``advance`` command for the run is on the queue."""
    return f"{PREFIX}:{{{run_id}}}:queued"


def stream(run_id: str) -> str:
    """Pub/sub channel: a run's partial outputs (``ToolContext.emit``), JSON messages
    ``{"run", "step", "attempt", "seq", "data"}``. Best-effort, never logged: a follower
    gets them only while it is subscribed (``Client.follow``)."""
    return f"{PREFIX}:{{{run_id}}}:stream"


# Global, derived and repairable -------------------------------------------------------

#: ZSET run id -> last update (ms since epoch).
RUNS_BY_UPDATE = f"{PREFIX}:runs"


def runs_in_state(state: str) -> str:
    """ZSET run id -> last update (ms), one per state."""
    return f"{PREFIX}:runs:{state}"


def ready(queue: str) -> str:
    """List of run ids waiting for a worker, drained by ``drain`` commands on RQ."""
    return f"{PREFIX}:ready:{queue}"


def drain_pending(queue: str) -> str:
    """String with PX TTL (ms): a ``drain`` command is on the RQ queue, not yet started."""
    return f"{PREFIX}:drain:{queue}"


#: ZSET run id -> time (ms) at which the reconciler must look at the run.
DUE = f"{PREFIX}:due"

#: Hash of counters (duplicates suppressed, forged cancels, stuck runs, ...).
STATS = f"{PREFIX}:stats"

#: Pub/sub channel carrying cancel hints.
CANCEL_CHANNEL = f"{PREFIX}:cancel"

#: Hash run id -> cancellation latency in ms (request -> canceled event).
CANCEL_LATENCY = f"{PREFIX}:cancel_latency_ms"

#: Hash agent name -> JSON ``{name, version, schema, tools, published_at, by, budgets}``:
#: the agents workers serve, with their input's JSON schema, so a producer can start a run
#: by name without importing the agent (``durable.catalog``). A worker writes its entries
#: when it starts; a producer that imports an agent adds one only where none exists. Not
#: derived from the logs.
AGENTS = f"{PREFIX}:agents"

#: Hash name -> "host:port" of the embedded server (also written to the data dir).
SERVER_INFO = f"{PREFIX}:server"

#: Hash of quarantined runs' reasons, run id -> reason (also in each run's log).
QUARANTINE = f"{PREFIX}:quarantine"

#: Hash approver name -> JSON ``{roles, public_key, fingerprint, added, by, revoked}``: the
#: registered approver keys (``durable.approvals``). Written by operators only (``durable
#: approvers``); not derived from the logs. A name is never re-used.
APPROVERS = f"{PREFIX}:approvers"
