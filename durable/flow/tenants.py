"""Tenants, owners and priorities: who a run is for, and how it ranks.

A start may name a **tenant** (the customer or team whose limits, fairness and metrics the
run counts against), an **owner** (the user or service that started it) and a
**priority** (``durable.flow.fairness``). They are recorded in the run's ``run_started`` event
(defaulted fields: a log written before them reads as tenant "", owner "", priority 0),
copied to the run's projection (``tenant``, ``owner``) and indexed per tenant
(``KeyLayout.runs_of_tenant``), so ``durable runs --tenant`` walks one tenant's runs only.

A child run inherits its parent's tenant and owner unless its start names others; a
schedule's runs get the schedule's. ``DURABLE_REQUIRE_TENANT`` refuses a start without one.

In the metrics the tenant is a label of bounded cardinality: the first
``DURABLE_METRIC_TENANTS`` tenants seen get their own value, every later one is counted as
``other`` (the set of labeled tenants is kept in ``keys.TENANT_LABELS``, shared by every
process, so all of them label a tenant alike).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import redis

from durable.errors import UsageError
from durable.log import counters, keys

#: Tenant and owner names: printable, no braces (a tenant may name a limiter's hash tag).
NAME_RE = re.compile(r"^[A-Za-z0-9_.:@+-]{1,64}$")

#: Priorities a start may give (higher is taken first).
MIN_PRIORITY, MAX_PRIORITY = -100, 100

#: Label of the tenants past the labeled ones; of a run without a tenant: "".
OTHER = "other"

#: The counter of runs started, by agent and tenant label (``durable_runs_started_total``).
RUNS_STARTED = "runs_started"

# Takes a label for a tenant: its own while fewer than the cap have one, else "other".
# KEYS[1] dx:tenant_labels  set of the tenants that have their own label
# ARGV[1] tenant, ARGV[2] cap (the most tenants with their own label)
_LABEL = """
local labels, tenant, cap = KEYS[1], ARGV[1], tonumber(ARGV[2])
if redis.call('SISMEMBER', labels, tenant) == 1 then return 1 end
if redis.call('SCARD', labels) < cap then
  redis.call('SADD', labels, tenant)
  return 1
end
return 0
"""


class Who(NamedTuple):
    """A start's tenant, owner and priority, checked."""

    tenant: str
    owner: str
    priority: int


def checked(tenant: str | None, owner: str | None, priority: int | None, *,
            required: bool = False) -> Who:
    """The tenant, owner and priority of a start, or a ``UsageError`` (nothing written)."""
    tenant, owner = tenant or "", owner or ""
    for what, value in (("tenant", tenant), ("owner", owner)):
        if value and not NAME_RE.match(value):
            raise UsageError(f"invalid {what} {value!r}: use 1-64 of A-Z a-z 0-9 _ . : @ + -")
    if required and not tenant:
        raise UsageError("a tenant is required on every start (DURABLE_REQUIRE_TENANT): "
                         "give one (--tenant, tenant=); nothing was written")
    prio = 0 if priority is None else priority
    if not isinstance(prio, int) or isinstance(prio, bool) or \
            not MIN_PRIORITY <= prio <= MAX_PRIORITY:
        raise UsageError(f"priority must be a whole number from {MIN_PRIORITY} to "
                         f"{MAX_PRIORITY}, not {priority!r}")
    return Who(tenant, owner, prio)


def fields(who: Who) -> dict[str, Any]:
    """The ``run_started`` fields of ``who`` (none when they are the defaults)."""
    out: dict[str, Any] = {}
    if who.tenant:
        out["tenant"] = who.tenant
    if who.owner:
        out["owner"] = who.owner
    if who.priority:
        out["priority"] = who.priority
    return out


def projection(who: Who) -> dict[str, str]:
    """The projection fields ``durable runs`` filters on, and the priority the ready
    lists order by (``durable.flow.fairness``)."""
    out = {k: v for k, v in (("tenant", who.tenant), ("owner", who.owner)) if v}
    if who.priority:
        out["priority"] = str(who.priority)
    return out


class Labels:
    """Bounded tenant labels for the metrics, shared through Redis, remembered here."""

    def __init__(self, client: redis.Redis, cap: int) -> None:
        self.redis = client
        self.cap = cap
        self._known: dict[str, str] = {}
        self._script = client.register_script(_LABEL)

    def of(self, tenant: str) -> str:
        if not tenant:
            return ""
        label = self._known.get(tenant)
        if label is None:
            label = tenant if self._script(keys=[keys.TENANT_LABELS],
                                           args=[tenant, self.cap]) else OTHER
            if len(self._known) < 10_000:
                self._known[tenant] = label
        return label

    def started(self, agent: str, tenant: str) -> tuple[str, int]:
        """The counter increment of one run of ``agent`` started for ``tenant``."""
        return counters.field(RUNS_STARTED, agent, self.of(tenant)), 1


def index(pipe: Any, layout: keys.KeyLayout, run_id: str, tenant: str, ts: int) -> None:
    """Add the run to its tenant's index (derived: ``repair`` rebuilds it)."""
    if tenant:
        pipe.zadd(layout.runs_of_tenant(tenant, layout.shard_of(run_id)), {run_id: ts})


def repair(client: redis.Redis, layout: keys.KeyLayout, run_id: str, tenant: str, ts: int) -> None:
    """Index one run again (``durable repair-index``)."""
    index(client, layout, run_id, tenant, ts)
