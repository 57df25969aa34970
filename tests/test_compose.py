"""deploy/compose.yaml: Redis reachable by the other services only, the image run as its
user, no secret written down, and the formation it describes working on real processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.test_image import parses

ROOT = Path(__file__).resolve().parent.parent


def _compose() -> dict[str, Any]:
    import yaml

    data: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    return data


def test_compose_redis_is_reachable_by_the_other_services_only() -> None:
    """Redis listens on the compose network (not its loopback), publishes no port on the
    host, keeps its AOF in the image's data directory (owned by its user: a fresh volume
    anywhere else is root's and Redis could not write it), and the others wait for it."""
    services = _compose()["services"]
    redis_svc = services["redis"]
    command = redis_svc["command"]
    assert command[command.index("--bind") + 1] == "0.0.0.0"
    assert command[command.index("--dir") + 1] == "/data"
    assert "redis-data:/data" in redis_svc["volumes"]
    assert "ports" not in redis_svc
    assert "healthcheck" in redis_svc
    for name, svc in services.items():
        if name in ("redis", "world"):
            continue
        assert svc["depends_on"] == {"redis": {"condition": "service_healthy"}}, name
        url = urlsplit(svc["environment"]["DURABLE_REDIS_URL"])
        assert url.hostname == "redis" and not url.password, name


def test_compose_services_run_the_image_as_its_user_and_no_secret_is_written_down() -> None:
    from durable.settings import WorkerSettings

    services = _compose()["services"]
    text = (ROOT / "deploy" / "compose.yaml").read_text()
    assert "change-me" not in text  # the password comes from the environment
    for name, svc in services.items():
        if name == "redis":
            continue
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile", name
        assert svc["user"] == "10001:10001", name
        parses(svc["command"])
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)  # loopback of the host only
    worker = services["worker"]
    assert worker["environment"]["DURABLE_REDIS_PASSWORD"].startswith(
        "${DURABLE_REDIS_PASSWORD:?")
    assert worker["environment"]["DURABLE_WORLD_URL"] == "http://world:8765"
    grace = float(worker["stop_grace_period"].rstrip("s"))
    assert grace > WorkerSettings.model_fields["shutdown_grace_s"].default


def _outward_address() -> str:
    """This host's address on its default route (no packet is sent), else loopback."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address: str = s.getsockname()[0]
        except OSError:
            address = "127.0.0.1"
    return address


def test_compose_redis_command_runs_and_answers_on_the_network(tmp_path: Path) -> None:
    """The compose file's Redis command line, run by a real Redis 7 (Debian's) with the
    shipped redis.conf: it answers on this host's network address with the password and
    refuses without it, passes the processes' own safety check, and writes its AOF in the
    directory the compose file gives it."""
    import subprocess

    import redis

    from durable.backend.connection import config_problems
    from durable.backend.embedded import free_port
    from durable.testing import wait_for
    from tests.servers.secure import debian_redis

    command = _compose()["services"]["redis"]["command"]
    assert command[:2] == ["redis-server", "/etc/redis/redis.conf"]
    password = "a-long-random-secret-for-this-test"
    args = [arg.replace("${DURABLE_REDIS_PASSWORD}", password) for arg in command[2:]]
    args[args.index("--dir") + 1] = str(tmp_path)
    port = free_port()
    proc = subprocess.Popen([debian_redis(), str(ROOT / "deploy" / "redis.conf"), *args,
                             "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    host = _outward_address()
    try:
        client = redis.Redis(host=host, port=port, password=password, socket_timeout=5)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        assert wait_for(answers, 20), f"no answer on {host}:{port}"
        assert client.config_get("bind")["bind"] == "0.0.0.0"
        assert config_problems(client.config_get("*")) == []
        client.set("k", "v")
        with redis.Redis(host=host, port=port, socket_timeout=5) as anonymous, \
                pytest.raises(redis.AuthenticationError):
            anonymous.get("k")
        assert wait_for(lambda: any(p.stat().st_size for p in tmp_path.rglob("*.aof*")
                                    if p.is_file()), 10)
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)


def _status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def test_every_process_that_runs_the_example_tools_shares_the_worlds_data() -> None:
    """The example's database is a SQLite file the world names (GET /info) and the tools
    open: in containers, the world, the workers, the reconciler and the console (its
    Reconcile button runs lookups) must see it at the same path."""
    services = _compose()["services"]
    world = services["world"]["command"]
    data_dir = world[world.index("--data-dir") + 1]
    for name in ("world", "worker", "reconciler", "console"):
        assert f"world-data:{data_dir}" in services[name]["volumes"], name
    assert "world-data" in _compose()["volumes"]
    assert f"install -d -o durable -g durable {data_dir}" in (
        ROOT / "deploy" / "Dockerfile").read_text()  # a fresh volume takes its owner


def test_the_formation_compose_describes_completes_a_run_of_the_example(
        tmp_path: Path) -> None:
    """Redis, the world, a worker, the reconciler and the metrics service, each started
    with its compose command line and environment (the service names and ports replaced by
    this host's), one shared data directory for the world: a `pipeline` run started as
    the compose file's comment says completes, and its effect is in the world's database."""
    import json
    import os
    import sqlite3
    import subprocess
    import sys
    import urllib.request

    from durable.backend.embedded import free_port
    from durable.testing import wait_for
    from tests.servers.secure import debian_redis

    services = _compose()["services"]
    password = "a-long-random-secret-for-this-test"
    ports = {"redis": free_port(), "world": free_port(), "metrics": free_port(),
             "worker": free_port()}
    data = tmp_path / "world"
    data.mkdir()

    #: compose's names for things, and this host's
    here = {"redis://redis:6379": f"redis://127.0.0.1:{ports['redis']}",
            "http://world:8765": f"http://127.0.0.1:{ports['world']}",
            "${DURABLE_REDIS_PASSWORD}": password, "/data": str(tmp_path),
            "/home/durable/world": str(data), "8765": str(ports["world"]),
            "9464": str(ports["metrics"]), "9100": str(ports["worker"])}

    def line(arg: str) -> str:
        return here.get(arg, arg)

    def env(service: str) -> dict[str, str]:
        found = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
        found["XDG_STATE_HOME"] = str(tmp_path / "state")
        for key, value in services[service].get("environment", {}).items():
            if value.startswith("${"):  # ${NAME:?...} or ${NAME:-default}
                name, _, default = value[2:-1].partition(":")
                value = password if name == "DURABLE_REDIS_PASSWORD" else default[1:]
            for theirs, ours in here.items():
                value = value.replace(theirs, ours) if "//" in theirs else value
            found[key] = value
        return found

    redis_cmd = [line(a) for a in services["redis"]["command"]]
    procs = [subprocess.Popen([debian_redis(), str(ROOT / "deploy" / "redis.conf"),
                               *redis_cmd[2:], "--port", str(ports["redis"])],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)]
    logs = {}
    try:
        for service in ("world", "worker", "reconciler", "metrics"):
            command = [line(a) for a in services[service]["command"]]
            # `durable X` or `python -m examples X`: the same, run by this Python
            module, args = ("examples", command[3:]) if command[0] == "python" else \
                ("durable", command[1:])
            logs[service] = tmp_path / f"{service}.log"
            with open(logs[service], "wb") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", module, *args], env=env(service),
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

        def durable(*args: str) -> str:
            done = subprocess.run([sys.executable, "-m", "durable", *args], env=env("worker"),
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert wait_for(lambda: _status(f"http://127.0.0.1:{ports['world']}/health") == 200,
                        30), logs["world"].read_text()
        durable("start", "pipeline", "--run-id", "c1", "--input",
                '{"source": "orders", "recipient": "ops@example.com"}')

        def state() -> str:
            return str(json.loads(durable("status", "c1", "--json"))["state"])

        assert wait_for(lambda: state() == "completed", 60, interval=0.5), (
            state(), {s: p.read_text()[-2000:] for s, p in logs.items()})
        with sqlite3.connect(data / "example.sqlite") as db:
            written = db.execute("SELECT count(*) FROM reports WHERE run_id = 'c1'").fetchone()
        assert written == (1,)  # the report the run wrote, once, in the shared directory
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics",
                                    timeout=10) as reply:
            assert b'durable_runs{state="completed"} 1.0' in reply.read()
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
