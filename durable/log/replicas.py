"""Appends acknowledged by replicas: ``DURABLE_MIN_REPLICAS``.

Redis replicates asynchronously: a master can answer an append and die before any replica
has it, and the replica that takes over then lacks an event a worker was told is written.
With ``min_replicas = k`` every ``append.lua`` call is followed, *on the same connection*
(``WAIT`` counts the replication offset of its own client's last write), by
``WAIT k timeout`` -- and by ``WAITAOF 0 k timeout`` where the server has it (Redis >= 7.2)
-- in one pipeline to the master that holds the run's slot. Fewer than ``k`` confirmations
raise :class:`durable.errors.ReplicationTimeout`: the caller never takes the append for
acknowledged. The event may still be on the master (and later on its replicas); the caller
reloads the run like after any Redis fault, and the log says what is there.

Where appends are batched (a worker's hub, ``EventLog.batch_appends``), one ``WAIT`` ends
each pipeline instead and covers every append in it (``durable.log.routes``); an append it
did not confirm is answered with the same ``ReplicationTimeout``.
"""

from __future__ import annotations

from typing import Any

import redis

from durable.errors import ReplicationTimeout
from durable.log.batching import ScriptBatcher
from durable.log.scripts import Scripts, source


class Replicated:
    """``append.lua`` with the replica acknowledgement the settings ask for."""

    def __init__(self, client: redis.Redis, scripts: Scripts, min_replicas: int,
                 timeout_ms: int) -> None:
        self.client = client
        self.scripts = scripts
        self.min_replicas = min_replicas
        self.timeout_ms = timeout_ms
        self._waitaof: dict[tuple[str, int], bool] = {}
        #: Sends the calls of many threads together (``EventLog.batch_appends``).
        self.batcher: ScriptBatcher | None = None

    async def append_async(self, run_id: str, keys: list[str], args: list[Any]) -> Any:
        """``append``, as a coroutine whose batched call is sent by whoever drives it (with
        the ``WAIT`` of its pipeline, ``durable.log.routes``, when replicas must confirm)."""
        if self.batcher is not None:
            return await self.batcher.script_call("append", keys, args, acks=run_id)
        return self.append(run_id, keys, args)

    def append(self, run_id: str, keys: list[str], args: list[Any]) -> Any:
        if self.batcher is not None:
            return self.batcher.call("append", keys, args, acks=run_id)
        if not self.min_replicas:
            return self.scripts.append(keys=keys, args=args)
        for attempt in range(3):
            node = self._node_client(keys[0])
            reply, acked, aof = self._append_and_wait(node, keys, args)
            if isinstance(reply, redis.exceptions.NoScriptError):
                node.script_load(source("append"))
                continue
            if isinstance(reply, redis.ResponseError) and str(reply).startswith("MOVED") \
                    and attempt < 2 and hasattr(self.client, "nodes_manager"):
                # The slot moved (a failover): the script did not run; ask again.
                self.client.nodes_manager.initialize()
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(reply, list | tuple) and reply and reply[0] in (b"ok", "ok"):
                if isinstance(acked, Exception):
                    raise acked
                if int(acked) < self.min_replicas or (
                        aof is not None and int(aof[1]) < self.min_replicas):
                    confirmed = int(acked) if aof is None else min(int(acked), int(aof[1]))
                    raise ReplicationTimeout(run_id, confirmed, self.min_replicas,
                                             self.timeout_ms)
            return reply
        raise ReplicationTimeout(run_id, 0, self.min_replicas, self.timeout_ms)

    def _append_and_wait(self, node: redis.Redis, keys: list[str],
                         args: list[Any]) -> tuple[Any, Any, Any]:
        script = self.scripts.append
        with node.pipeline(transaction=False) as pipe:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", self.min_replicas, self.timeout_ms)
            aof = self._has_waitaof(node)
            if aof:
                pipe.execute_command("WAITAOF", 0, self.min_replicas, self.timeout_ms)
            replies = pipe.execute(raise_on_error=False)
        return replies[0], replies[1], replies[2] if aof else None

    def _node_client(self, key: str) -> redis.Redis:
        """The plain client of the master holding ``key`` (the client itself off-cluster)."""
        get_node = getattr(self.client, "get_node_from_key", None)
        if get_node is None:
            return self.client
        node = get_node(key)
        conn: redis.Redis = self.client.get_redis_connection(node)
        return conn

    def _has_waitaof(self, node: redis.Redis) -> bool:
        kw = node.connection_pool.connection_kwargs
        where = (str(kw.get("host")), int(kw.get("port", 0)))
        if where not in self._waitaof:
            version = str(node.info("server").get("redis_version", "0"))
            major, minor = (int(x) for x in [*version.split("."), "0"][:2])
            self._waitaof[where] = (major, minor) >= (7, 2)
        return self._waitaof[where]
