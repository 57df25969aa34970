"""Every Redis key and channel the system uses, in one place.

Two layouts, chosen by ``DURABLE_SHARDS`` (``settings.cluster.layout_shards``) and fixed for
the life of the data (``dx:layout`` records it; a process configured otherwise refuses to
start). A ``KeyLayout`` value names the keys of one layout; each ``EventLog`` owns one
(``elog.keys.log(run_id)``), so logs of different layouts can live in one process. The keys
that do not depend on the layout (the queue's, the console's, constants) are module-level.

- **unsharded** (0, the single-server default): a run's keys carry the hash tag
  ``{run_id}`` (``dx:{R}:log``); the derived indexes are one key each (``dx:runs``,
  ``dx:runs:<state>``, ``dx:due``).
- **N shards** (Redis Cluster; 16 by default there): a run belongs to shard
  ``crc16(run_id) mod N``, and its keys carry that shard's hash tag (``dx:{<tag>}:R:log``),
  so do the shard's indexes (``dx:{<tag>}:runs``, ``dx:{<tag>}:runs:<state>``,
  ``dx:{<tag>}:due``): ``append.lua`` still writes a run's log and its indexes atomically,
  in one slot. Readers (``Client.runs``, the reconciler, ``repair-index``) read across the
  N shards. The tags are chosen so that shard k hashes into the k-th N-th of the slot
  space: the shards spread evenly over masters that split the slots evenly.

Global keys are derived data: they can be rebuilt from the run logs (``durable
repair-index``). Keys of the queue (ready lists, drain markers, RQ's own) live on the
queue's server (``DURABLE_QUEUE_URL``), not the log's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

if TYPE_CHECKING:
    from durable.settings import Settings

PREFIX = "dx"

#: run ids are short, printable and safe inside a hash tag (no braces).
RUN_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")

#: The built-in step that starts a child run (``durable.controls.children``).
CHILD_TOOL = "durable.child"

#: How a parent's projected reason starts while the child it waits for is quarantined
#: (``durable.controls.children``; the ``durable_runs_blocked_by_child`` gauge counts them).
BLOCKED_BY_CHILD = "blocked: child"


def child_id(parent: str, step: int) -> str:
    """The run id of the child a parent's ``step`` starts: derived, so that a parent
    executed again starts it once (a second start of the same id is a no-op)."""
    return f"{parent}.{step}"

@cache
def shard_tag(k: int, n: int) -> str:
    """The hash tag of shard ``k`` of ``n``: the first ``"<k>.<j>"`` whose slot lies in the
    k-th n-th of the slot space (deterministic: every process computes the same tags)."""
    low = k * REDIS_CLUSTER_HASH_SLOTS // n
    high = (k + 1) * REDIS_CLUSTER_HASH_SLOTS // n
    j = 0
    while not low <= key_slot(f"{k}.{j}".encode()) < high:
        j += 1
    return f"{k}.{j}"


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """The keys of one log's data: ``shards`` 0 is the unsharded layout, N the sharded one
    (see the module's docstring). Owned by the ``EventLog`` (``elog.keys``), made from the
    settings (``KeyLayout.of``); two logs of one process may have different layouts."""

    shards: int = 0

    def __post_init__(self) -> None:
        if self.shards < 0:
            raise ValueError(f"shards must be >= 0, not {self.shards}")

    @classmethod
    def of(cls, settings: Settings) -> KeyLayout:
        """The layout ``DURABLE_SHARDS`` (or ``DURABLE_REDIS_CLUSTER``) names."""
        return cls(settings.cluster.layout_shards)

    # Shards ------------------------------------------------------------------------------

    def shard_of(self, run_id: str) -> int | None:
        """The run's shard, or None when the layout is unsharded."""
        if not self.shards:
            return None
        return int(key_slot(run_id.encode())) % self.shards

    def shard_ids(self) -> list[int | None]:
        """Every shard a reader must look at: ``[None]`` when unsharded."""
        return list(range(self.shards)) if self.shards else [None]

    def _per_run(self, run_id: str, name: str) -> str:
        if not self.shards:
            return f"{PREFIX}:{{{run_id}}}:{name}"
        return f"{PREFIX}:{{{shard_tag(key_slot(run_id.encode()) % self.shards, self.shards)}}}:" \
               f"{run_id}:{name}"

    def _global(self, name: str, shard: int | None) -> str:
        if shard is None:
            return f"{PREFIX}:{name}"
        return f"{PREFIX}:{{{shard_tag(shard, self.shards)}}}:{name}"

    def pattern(self, name: str, shard: int | None) -> str:
        """SCAN pattern of one per-run key (``log``, ``lease``...) of the runs of one shard;
        ``run_of`` reads the run id back from a key found."""
        if shard is None:
            return f"{PREFIX}:{{*}}:{name}"
        return f"{PREFIX}:{{{shard_tag(shard, self.shards)}}}:*:{name}"

    def run_of(self, key: str) -> str:
        """The run id of a per-run key (either layout)."""
        tail = key[len(PREFIX) + 2:key.rindex(":")]  # after "dx:{", before ":<name>"
        tag, _, rest = tail.partition("}")
        return rest[1:] if self.shards else tag

    def log_pattern(self, shard: int | None) -> str:
        return self.pattern("log", shard)

    def run_of_log(self, key: str) -> str:
        return self.run_of(key)

    # A run's keys ------------------------------------------------------------------------

    def log(self, run_id: str) -> str:
        """Stream: the run's append-only log. Never trimmed while the run lives."""
        return self._per_run(run_id, "log")

    def run(self, run_id: str) -> str:
        """Hash: cached projection (state, version, step, ``last``: the last entry id and the
        log's hash chain head after it (``durable.log.chain``), checkpoint id, due), and
        ``held``: the lease taken last, until it is released (an expiry is counted when
        a new lease is taken while it is still set)."""
        return self._per_run(run_id, "run")

    def ledger(self, run_id: str) -> str:
        """Hash: idempotency key -> ``claimed|<deadline ms>`` or ``done|<outcome>``."""
        return self._per_run(run_id, "fx")

    def blobs(self, run_id: str) -> str:
        """Hash: the run's large values (``durable.log.blobs``), field ``<step>.<seq>`` (the
        outcome event that refers to it) -> the value's JSON, sensitive fields sealed.
        Written by ``append.lua`` with that event; expires and is archived with the run's
        log."""
        return self._per_run(run_id, "blobs")

    def seal(self, run_id: str) -> str:
        """String: the seal of a terminal run's log (``durable.log.chain``: a signature over
        its hash chain head, JSON). A key of its own: its ~170 bytes in the projection would
        turn that small hash into a full hash table (values over 64 bytes). Expires and is
        archived with the run's log."""
        return self._per_run(run_id, "seal")

    def lease(self, run_id: str) -> str:
        """String ``<owner token>|<epoch>`` with a PX time to live (ms). Not business
        state."""
        return self._per_run(run_id, "lease")

    def fence(self, run_id: str) -> str:
        """Integer: the fencing epoch, incremented on every lease acquisition."""
        return self._per_run(run_id, "fence")

    def queued(self, run_id: str) -> str:
        """String with PX TTL (ms): an ``advance`` command for the run is on the queue. On
        the log's server (``lease_acquire.lua`` drops it with the lease), not the queue's."""
        return self._per_run(run_id, "queued")

    def stream(self, run_id: str) -> str:
        """Pub/sub channel: a run's partial outputs (``ToolContext.emit``), JSON messages
        ``{"run", "step", "attempt", "seq", "data"}``. Best-effort, never logged: a
        follower gets them only while it is subscribed (``Client.follow``)."""
        return self._per_run(run_id, "stream")

    def partials(self, run_id: str) -> str:
        """Hash step -> bytes kept of its partial output, for the steps in flight
        (``durable.streams.streaming``); PX expiry renewed at each emit."""
        return self._per_run(run_id, "partials")

    def partial(self, run_id: str, step: int) -> str:
        """List: the partial output messages kept of one step in flight, oldest first,
        bounded (``DURABLE_PARTIAL_KEEP_BYTES``); deleted when its call ends; PX expiry."""
        return self._per_run(run_id, f"partial:{step}")

    # Indexes, derived and repairable, one per shard ----------------------------------------

    def runs_index(self, shard: int | None = None) -> str:
        """ZSET run id -> last update (ms since epoch) of one shard."""
        return self._global("runs", shard)

    def runs_of(self, run_id: str) -> str:
        """The ``runs_index`` of the run's shard."""
        return self.runs_index(self.shard_of(run_id))

    def runs_in_state(self, state: str, shard: int | None = None) -> str:
        """ZSET run id -> last update (ms), one per state (and shard)."""
        return self._global(f"runs:{state}", shard)

    def runs_of_tenant(self, tenant: str, shard: int | None = None) -> str:
        """ZSET run id -> start time (ms) of the runs of one tenant, per shard
        (``durable.flow.tenants``): what ``durable runs --tenant`` walks."""
        return self._global(f"tenant:{tenant}", shard)

    def due(self, shard: int | None = None) -> str:
        """ZSET run id -> time (ms) at which the reconciler must look at the run, per
        shard."""
        return self._global("due", shard)

    def context_swept(self, state: str, shard: int | None = None) -> str:
        """String: the ``runs_in_state`` score (ms) up to which the reconciler has removed
        ended runs' model context (``DURABLE_CONTEXT_RETENTION``), per state and shard."""
        return self._global(f"context_swept:{state}", shard)

    def due_of(self, run_id: str) -> str:
        """The due set of the run's shard."""
        return self.due(self.shard_of(run_id))

    def metrics(self, shard: int | None = None) -> str:
        """Hash of the shared Prometheus counters and histogram buckets
        (``durable.log.counters``): field = JSON ``[metric, label values..., bucket]``, value
        = integer count (durations in ms). ``append.lua`` adds to the one of the run's shard,
        in the call that writes the events counted, so every process shares them and they
        survive restarts; counts with no event go to the unsharded one (``shard`` None). Not
        derived: a counter that is rebuilt is a reset."""
        return self._global("metrics", shard)

    def metrics_keys(self) -> list[str]:
        """Every counters hash a reader sums: each shard's, and the unsharded one."""
        return list(dict.fromkeys([*(self.metrics(s) for s in self.shard_ids()),
                                   self.metrics(None)]))

    def region(self, shard: int | None = None) -> str:
        """Hash of the region that may advance the runs of one shard (``durable.backend.
        regions``): ``owner`` (a region id), ``epoch`` (grows at every takeover), ``state``
        (``active``, or ``taking-over`` while a takeover checks the runs: nobody acquires
        then). One per shard, in its slot, so ``lease_acquire.lua`` reads it beside the
        run's keys; a takeover writes every shard's. Not derived."""
        return self._global("region", shard)

    def region_of(self, run_id: str) -> str:
        """The ``region`` hash of the run's shard."""
        return self.region(self.shard_of(run_id))


#: The single-server layout (``DURABLE_SHARDS`` 0).
UNSHARDED = KeyLayout(0)


def _session_tag(tenant: str, name: str) -> str:
    return f"session/{tenant}/{name}"  # "/" is in neither a tenant's nor a session's name


def session(tenant: str, name: str) -> str:
    """Hash of a named session of a tenant (``durable.controls.sessions``): ``head`` its latest
    run, ``from`` the run that one continues, ``at`` when it was claimed (ms), ``n`` its
    runs so far. In every layout its own hash tag (one slot with ``session_runs``): no script
    touches a session's keys with a run's."""
    return f"{PREFIX}:{{{_session_tag(tenant, name)}}}:session"


def session_runs(tenant: str, name: str) -> str:
    """ZSET run id -> its turn in the session (1, 2, ...): ``durable runs --session``."""
    return f"{PREFIX}:{{{_session_tag(tenant, name)}}}:session_runs"


# Global, derived and repairable -------------------------------------------------------

#: Hash ``shards`` -> the layout's shard count: written once, checked by every process.
LAYOUT = f"{PREFIX}:layout"

#: ZSET run id -> last update (ms since epoch), unsharded layout (``runs_index``).
RUNS_BY_UPDATE = f"{PREFIX}:runs"


def ready(queue: str, route: str = "") -> str:
    """List of run ids waiting for a worker, drained by ``drain`` commands on RQ: one per
    route (an agent's name, or ``name@version`` for runs only that version may take); the
    list without a route holds runs made ready before routing, for any worker."""
    return f"{PREFIX}:ready:{queue}:{route}" if route else f"{PREFIX}:ready:{queue}"


def fair(ready_key: str, part: str) -> str:
    """A key of the fair side of a ready list (``durable.flow.fairness``), beside the list
    ``ready_key``: ``runs`` (ZSET run id -> virtual start - priority x aging), ``clock``
    (HASH: the route's virtual time and each tenant's last start), ``prio`` (HASH run id ->
    priority, for the runs whose priority is not 0). On the queue's server."""
    return f"{PREFIX}:fair:{part}:{ready_key[len(PREFIX) + 7:]}"


def routes(queue: str) -> str:
    """Set of the routes runs were made ready on (``ready``): what readers sum."""
    return f"{PREFIX}:routes:{queue}"


def drain_pending(queue: str) -> str:
    """String with PX TTL (ms): a ``drain`` command is on the RQ queue, not yet started."""
    return f"{PREFIX}:drain:{queue}"


#: The due set of the unsharded layout (``due``/``due_of`` for either layout).
DUE = f"{PREFIX}:due"

#: Hash of counters (duplicates suppressed, forged cancels, stuck runs, ...).
STATS = f"{PREFIX}:stats"

#: The counters hash of the counts with no event, in either layout (``KeyLayout.metrics``).
METRICS = f"{PREFIX}:metrics"

# Worker liveness (``durable.telemetry.liveness``): one hash tag for both keys, so on a cluster they
# sit on one master and a reconciler that can read one can read the other. Not derived.

#: Set of the ids of the worker processes that announced themselves (and did not leave).
WORKERS = f"{PREFIX}:{{workers}}:all"


def alive(worker_id: str) -> str:
    """String with PX TTL (``DURABLE_LIVENESS_TTL_MS``): the worker process is alive. Set
    again every third of the TTL; once it is gone, the reconciler releases the worker's
    leases."""
    return f"{PREFIX}:{{workers}}:alive:{worker_id}"


#: Set of the tenants that have their own label in the metrics (``durable.flow.tenants``): the
#: first ``DURABLE_METRIC_TENANTS`` seen; the others are counted as "other". Not derived.
TENANT_LABELS = f"{PREFIX}:tenant_labels"

# Limits shared by every worker (``durable.flow.limits``): the keys of one limiter (one limit,
# one key value) share the hash tag ``{limit:<name>:<key>}``, so one script decides on one
# slot. Not derived: they expire once the limiter is idle.


def limiter(name: str, key: str, part: str) -> str:
    """One key of a limiter: ``inflight``, ``calls``, ``tokens``, ``used``, ``state``,
    ``waiting`` (see ``limit_take.lua``)."""
    return f"{PREFIX}:{{limit:{name}:{key}}}:{part}"


#: Hash ``<name>|<key>`` -> last decision (ms): the limiters in use, for ``durable
#: limits`` and the metrics (an entry idle for a day is dropped by its next reader).
LIMITERS = f"{PREFIX}:limiters"

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

#: Hash reconciler token -> JSON ``{at, examined, actions, did_at, did}``: each reconciler
#: process's last sweep (``at``, ms) and the last sweep that did something (``did``: run id
#: -> what was done, at most 20). Expires 300 s after the last write of any reconciler: not
#: derived from the logs, only a view for operators (``durable console``).
SWEEPS = f"{PREFIX}:sweeps"

#: Hash approver name -> JSON ``{roles, public_key, fingerprint, added, by, revoked}``: the
#: registered approver keys (``durable.controls.approvals``). Written by operators only (``durable
#: approvers``); not derived from the logs. A name is never re-used.
APPROVERS = f"{PREFIX}:approvers"

# Schedules: one hash tag for the three keys, so one script changes a schedule's definition
# and its next slot together (on a cluster too). Written by operators (``durable schedule``)
# and advanced by the reconciler; not derived from the logs.

#: Hash schedule name -> JSON definition (``durable.controls.schedules.Schedule``).
SCHEDULES = f"{PREFIX}:{{schedules}}:defs"

#: ZSET schedule name -> its next slot not yet handled (ms since epoch): the schedules'
#: due-set, swept by the reconciler. A paused schedule has no entry.
SCHEDULES_NEXT = f"{PREFIX}:{{schedules}}:next"

#: Hash schedule name -> JSON ``{at, slot, error}``: the last slot that could not be started
#: (cleared by the next slot that starts).
SCHEDULE_ERRORS = f"{PREFIX}:{{schedules}}:errors"

# The console's own keys: not derived from the logs, each a single key (one slot on a
# cluster too), each with an expiry, so a console restart or a second console process
# sees the same sessions and the same login failures.


def console_session(sid_digest: str) -> str:
    """String: the user name of one console session, PX = the session's lifetime (ms).
    Named by the SHA-256 (hex) of the session id the signed cookie carries, so a reader of
    Redis learns no cookie; deleted at logout, so a cookie saved before it is refused."""
    return f"{PREFIX}:console:session:{sid_digest}"


def login_failures(kind: str, who: str) -> str:
    """Zset: the failed console logins of a user name (``kind`` ``user``) or a client
    address (``addr``) within the window, member -> time (ms); PX = the window (ms), from
    the last (``login_take.lua``)."""
    return f"{PREFIX}:console:fails:{kind}:{who}"


def a2a_push(run_id: str) -> str:
    """Hash: the A2A push-notification configs of a run's task (``durable a2a``): config id
    -> its JSON; the field ``_cursor`` is the log entry notified last. EX = 7 days, renewed
    by each config set."""
    return f"{PREFIX}:a2a:push:{run_id}"


#: What ``durable a2a`` scans at start for tasks whose notifications it goes on sending.
A2A_PUSH_MATCH = f"{PREFIX}:a2a:push:*"
