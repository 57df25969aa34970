"""Where the calls of a batch go (``durable.log.batching``): one server, or the masters of a
Redis Cluster; and the replica acknowledgement (``DURABLE_MIN_REPLICAS``) that each
connection's writes wait for.

On a cluster a batch is split into one *part* per master: each call goes to the master
that owns the slot of its first key (every script of this project touches the keys of one
run, one slot, so a call never spans two). A part is sent on one connection of that
master, in one packed write, and its replies are read in order.

``WAIT k timeout`` counts the replicas that have every write its own connection made
before it. So with ``min_replicas = k`` a part holding an append gets one ``WAIT`` (and
``WAITAOF 0 k timeout`` where the server has it, Redis >= 7.2) after its last call:
one round of replica acknowledgements covers every append in it, instead of one per
append. An append whose part's ``WAIT`` confirmed fewer than ``k`` replicas is answered
with :class:`durable.errors.ReplicationTimeout`, exactly as an append sent alone
(``durable.log.replicas``): the caller never takes it for acknowledged; the event may
still be on the master, and the caller reloads the run like after any Redis fault.

A call is anything :class:`Routed` (the batcher's ``RedisCall``): what is sent, and the run
whose append it is. A part keeps its calls' own type, so the batcher reads its calls back
as it made them, and this module never imports the batcher.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import redis
from redis.crc import key_slot

from durable.errors import ReplicationTimeout

#: Commands whose first argument is not a key: sent to any master.
_KEYLESS = frozenset({"PUBLISH", "PING", "ASKING", "WAIT", "WAITAOF", "SCRIPT", "INFO"})


class Routed(Protocol):
    """A call as routing sees it (``durable.log.batching.RedisCall``)."""

    #: What is sent: ``EVALSHA sha numkeys keys... args...``, or a plain command.
    @property
    def command(self) -> tuple[Any, ...]: ...
    #: The run whose append this is (its ``ok`` waits for the replicas), or None.
    @property
    def acks(self) -> str | None: ...


C = TypeVar("C", bound=Routed)


@dataclass(eq=False)
class Part(Generic[C]):
    """The calls of a batch that go to one server, and what is sent for them."""

    #: The server's name (``host:port``; ``""`` off-cluster).
    node: str
    calls: list[C]
    #: What is sent: the calls (each after an ``ASKING`` when ``asking``), then the waits.
    wire: list[Any] = field(default_factory=list)
    #: ``WAIT`` (and ``WAITAOF``) sent after the calls.
    waits: int = 0
    asking: bool = False
    #: The connection it was sent on, by a driver that reads its replies later
    #: (``durable.log.inflight``); None until sent.
    sent_on: Any = None
    #: Which of that server's connections (``durable.log.inflight.WAIT_LANES``).
    lane: int = 0


class Routes:
    """The parts of a batch and the connections they go on (see the module doc)."""

    def __init__(self, client: redis.Redis, min_replicas: int = 0,
                 timeout_ms: int = 2000) -> None:
        self.client = client
        #: The cluster client, or None on one server.
        self.cluster: Any = client if hasattr(client, "nodes_manager") else None
        self.min_replicas = min_replicas
        self.timeout_ms = timeout_ms
        self._waitaof: dict[str, bool] = {}

    # Routing ---------------------------------------------------------------------------

    def parts(self, batch: list[C], *, asking: str | None = None) -> list[Part[C]]:
        """``batch`` split by the server each call goes to, in order within each; with
        ``asking`` (a node named by an ``ASK`` redirection) all of it goes there."""
        if self.cluster is None:
            return [self._wired(Part("", batch))]
        if asking is not None:
            return [self._wired(Part(asking, batch, asking=True))]
        by_node: dict[str, list[C]] = {}
        for call in batch:
            by_node.setdefault(self.node_of(call), []).append(call)
        return [self._wired(Part(node, calls)) for node, calls in by_node.items()]

    def node_of(self, call: Routed) -> str:
        """The name of the master that owns ``call``'s first key (any master if none)."""
        key = first_key(call.command)
        manager = self.cluster.nodes_manager
        if key is None:
            return str(self.cluster.get_default_node().name)
        raw = key if isinstance(key, bytes) else str(key).encode()
        try:
            return str(manager.get_node_from_slot(key_slot(raw)).name)
        except redis.exceptions.SlotNotCoveredError as exc:  # a failover under way: as a
            raise redis.ConnectionError(str(exc)) from exc    # master not reached

    def pool(self, node: str) -> Any:
        """The connection pool of the server named ``node``."""
        if self.cluster is None:
            return self.client.connection_pool
        found = self.cluster.get_node(node_name=node)
        if found is None:  # the topology changed since the part was made: route again
            raise redis.ConnectionError(f"cluster node {node} is no longer known")
        return self.cluster.get_redis_connection(found).connection_pool

    # Replica acknowledgements ------------------------------------------------------------

    def _wired(self, part: Part[C]) -> Part[C]:
        wire: list[Any] = []
        for call in part.calls:
            if part.asking:
                wire.append(("ASKING",))
            wire.append(call.command)
        if self.min_replicas and any(call.acks is not None for call in part.calls):
            wire.append(("WAIT", self.min_replicas, self.timeout_ms))
            part.waits = 1
            if self._has_waitaof(part.node):
                wire.append(("WAITAOF", 0, self.min_replicas, self.timeout_ms))
                part.waits = 2
        part.wire = wire
        return part

    def unwire(self, part: Part[Any], replies: list[Any]) -> list[Any]:
        """The replies of ``part``'s calls, from what its wire read: the ``ASKING`` replies
        dropped, and each append's ``ok`` replaced by ``ReplicationTimeout`` when the
        part's waits confirmed fewer replicas than asked."""
        waits = replies[len(replies) - part.waits:] if part.waits else []
        mine = replies[: len(replies) - part.waits]
        if part.asking:
            mine = mine[1::2]
        if not waits:
            return mine
        confirmed: Any = waits[0]
        if not isinstance(confirmed, Exception) and len(waits) > 1:
            aof = waits[1]
            confirmed = aof if isinstance(aof, Exception) else min(int(confirmed), int(aof[1]))
        out = []
        for call, reply in zip(part.calls, mine, strict=True):
            if call.acks is not None and _ok(reply):
                if isinstance(confirmed, Exception):
                    reply = confirmed
                elif int(confirmed) < self.min_replicas:
                    reply = ReplicationTimeout(call.acks, int(confirmed), self.min_replicas,
                                               self.timeout_ms)
            out.append(reply)
        return out

    def _has_waitaof(self, node: str) -> bool:
        """Whether the server named ``node`` has ``WAITAOF`` (asked once)."""
        if node not in self._waitaof:
            pool = self.pool(node)
            conn = pool.get_connection()
            try:
                conn.send_command("INFO", "server")
                info = conn.read_response()
            finally:
                pool.release(conn)
            text = info.decode() if isinstance(info, bytes) else str(info)
            version = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                            if line.startswith("redis_version:")), "0")
            major, minor = (int(x) for x in [*version.split("."), "0"][:2])
            self._waitaof[node] = (major, minor) >= (7, 2)
        return self._waitaof[node]


def first_key(command: tuple[Any, ...]) -> Any:
    """The first key ``command`` names (its slot decides its master), or None."""
    name = command[0]
    if name in ("EVALSHA", "EVAL"):
        return command[3] if int(command[2]) else None
    if name in _KEYLESS or len(command) < 2:
        return None
    return command[1]


def _ok(reply: Any) -> bool:
    return isinstance(reply, list | tuple) and bool(reply) and reply[0] in (b"ok", "ok")
