"""What an operator copies: it must pass the project's own connect-time safety check, the
Procfiles run, and the image and compose file hold what they promise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from durable.connection import config_problems, parse_config_file

ROOT = Path(__file__).resolve().parent.parent


def test_deploy_redis_conf_passes_the_safety_check() -> None:
    cfg = parse_config_file((ROOT / "deploy" / "redis.conf").read_text())
    assert config_problems(cfg) == []
    assert cfg["requirepass"]


def test_the_safety_check_catches_what_would_lose_events() -> None:
    assert config_problems({"appendonly": "no"})
    assert config_problems({"appendonly": "yes", "appendfsync": "no"})
    assert config_problems({"appendonly": "yes", "maxmemory-policy": "allkeys-lru"})


def _procfile(name: str) -> dict[str, str]:
    text = (ROOT / name).read_text()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines())}


def _dev_formation(tmp_path: Path) -> dict[str, str]:
    """A folder holding Procfile.dev, and the environment to run it from: its own port and
    data dir, the example agents, and the `durable` script next to this Python on PATH."""
    import os
    import sys

    from durable.embedded import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    env["DURABLE_PORT"] = str(free_port())
    env["DURABLE_CONSOLE_PORT"] = str(free_port())
    env["DURABLE_AGENTS"] = "examples.agents"
    env["DURABLE_DATA_DIR"] = str(tmp_path / ".durable")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    (tmp_path / "Procfile.dev").write_text((ROOT / "Procfile.dev").read_text())
    return env


def test_the_production_procfile_names_no_embedded_server() -> None:
    """Production: workers, the reconciler and the console against DURABLE_REDIS_URL,
    nothing else; the console asks for a login (no --dev)."""
    assert _procfile("Procfile") == {
        "worker": "durable worker", "reconciler": "durable reconciler",
        "console": "durable console --host ${DURABLE_CONSOLE_HOST:-127.0.0.1} "
                   "--port ${DURABLE_CONSOLE_PORT:-8700}"}


def test_the_development_procfile_runs_the_embedded_server_too() -> None:
    lines = _procfile("Procfile.dev")
    assert lines["redis"].startswith("durable redis")
    assert lines["worker"].endswith("durable worker")
    assert lines["reconciler"].endswith("durable reconciler")
    assert "durable console --dev" in lines["console"]  # loopback only: no login


def test_ctrl_c_stops_the_development_formation_workers_first_and_redis_last(
    tmp_path: Path,
) -> None:
    """`honcho -f Procfile.dev start -c worker=2`, 20 runs in flight (each inside a
    one-second call) when SIGINT arrives: the workers hand their runs back and exit, Redis
    stops last, nothing prints a traceback, and after a restart every run completes."""
    import os
    import signal
    import subprocess
    import sys

    from durable.testing import wait_for

    env = _dev_formation(tmp_path)

    def formation() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "honcho", "-f", "Procfile.dev", "start", "-c", "worker=2"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True)

    def durable(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "durable", *args], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def states() -> list[str]:
        return [line.split('"state":"')[1].split('"')[0]
                for line in durable("runs", "--json", "--limit", "100").splitlines()]

    honcho = formation()
    try:
        assert wait_for(lambda: (tmp_path / ".durable" / "server.json").exists(), 30)
        for i in range(20):
            durable("start", "count", "--run-id", f"f{i}", "--input",
                    '{"steps": 10, "sleep_s": 1.0}')
        assert wait_for(lambda: states().count("completed") < 20 and
                        len(states()) == 20, 30)
        wait_for(lambda: False, 1.5)  # the runs are inside their calls now
    finally:
        os.killpg(honcho.pid, signal.SIGINT)
        first = honcho.communicate(timeout=60)[0].decode()
    assert "Traceback" not in first, first
    assert "embedded redis stopped" in first
    assert first.rindex("embedded redis stopped") > max(
        first.rfind("worker.1 stopped"), first.rfind("worker.2 stopped"))
    honcho = formation()
    try:
        assert wait_for(lambda: (tmp_path / ".durable" / "server.json").exists(), 30)
        assert wait_for(lambda: states().count("completed") == 20, 60, interval=0.5), states()
    finally:
        os.killpg(honcho.pid, signal.SIGINT)
        second = honcho.communicate(timeout=60)[0].decode()
    assert "Traceback" not in second, second


def test_honcho_runs_the_procfile_with_scaled_workers(tmp_path: Path) -> None:
    """`honcho -f Procfile.dev start -c worker=2`: the embedded server, two workers and the
    reconciler; a run started from outside (through the address the server recorded)
    completes."""
    import os
    import signal
    import subprocess
    import sys

    from durable.testing import wait_for

    env = _dev_formation(tmp_path)
    honcho = subprocess.Popen([sys.executable, "-m", "honcho", "-f", "Procfile.dev", "start",
                               "-c", "worker=2"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def durable(*args: str) -> str:
            out = subprocess.run([sys.executable, "-m", "durable", *args], cwd=tmp_path,
                                 env=env, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            return out.stdout

        assert wait_for(lambda: (tmp_path / ".durable" / "server.json").exists(), 30)
        run = durable("start", "count", "--input", '{"steps": 3}').strip()
        assert wait_for(lambda: '"state":"completed"' in durable("status", run, "--json"),
                        30, interval=0.2), durable("status", run, "--json")
    finally:
        os.killpg(honcho.pid, signal.SIGTERM)
        output = honcho.communicate(timeout=30)[0].decode()
    assert "worker.2" in output and "reconciler.1" in output
    assert len(list(tmp_path.glob(".durable/*.aof"))) == 1  # one server, the Procfile's


def _dockerfile() -> list[tuple[str, str]]:
    """deploy/Dockerfile as (INSTRUCTION, arguments), continuation lines joined."""
    text = (ROOT / "deploy" / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [(op.upper(), rest.strip()) for op, _, rest in
            (line.partition(" ") for line in lines if line and not line.startswith("#"))]


def _compose() -> dict[str, Any]:
    import yaml

    data: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    return data


def _parses(command: list[str]) -> None:
    """``command`` is a ``durable`` command line the CLI accepts."""
    from durable.cli.main import build_parser

    assert command[0] == "durable", command
    build_parser().parse_args(command[1:])


def test_the_image_runs_as_a_user_of_its_own() -> None:
    """The last USER is numeric and not root (Kubernetes' runAsNonRoot can check only a
    numeric one), and nothing runs after it as root."""
    steps = _dockerfile()
    users = [i for i, (op, _) in enumerate(steps) if op == "USER"]
    assert users, "no USER: the image would run as root"
    uid = steps[users[-1]][1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, uid
    assert not [op for op, _ in steps[users[-1]:] if op == "RUN"]
    [(_, cmd)] = [s for s in steps if s[0] == "CMD"]
    _parses(json.loads(cmd))


def test_the_build_context_leaves_out_the_virtualenv_and_git() -> None:
    """.dockerignore keeps .venv and .git out of the context, and the image copies the
    project's packages one by one (never the whole context)."""
    ignored = {line.strip().rstrip("/") for line in
               (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", ".git", "tests", "**/__pycache__"} <= ignored
    sources = [args.split()[:-1] for op, args in _dockerfile() if op == "COPY"]
    copied = {src for srcs in sources for src in srcs}
    assert "." not in copied and not copied & ignored, copied
    for src in copied:
        assert (ROOT / src).exists(), src


def test_the_image_holds_the_example_agents() -> None:
    """The image installs the examples package and names its agents by default, so a
    compose or Helm install runs something before your agents are in."""
    import importlib

    copied = {args.split()[0] for op, args in _dockerfile() if op == "COPY"}
    assert {"durable", "workers", "reconciler", "console", "examples"} <= copied
    env = " ".join(args for op, args in _dockerfile() if op == "ENV")
    assert "DURABLE_AGENTS=examples.agents" in env and "PYTHONPATH=/agents" in env
    from durable.agents import registry

    importlib.import_module("examples.agents")
    assert {"pipeline", "count"} <= set(registry.agents)


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
    from durable.settings import Settings

    services = _compose()["services"]
    text = (ROOT / "deploy" / "compose.yaml").read_text()
    assert "change-me" not in text  # the password comes from the environment
    for name, svc in services.items():
        if name == "redis":
            continue
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile", name
        assert svc["user"] == "10001:10001", name
        _parses(svc["command"])
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)  # loopback of the host only
    worker = services["worker"]
    assert worker["environment"]["DURABLE_REDIS_PASSWORD"].startswith(
        "${DURABLE_REDIS_PASSWORD:?")
    assert worker["environment"]["DURABLE_WORLD_URL"] == "http://world:8765"
    grace = float(worker["stop_grace_period"].rstrip("s"))
    assert grace > Settings.model_fields["shutdown_grace_s"].default


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

    from durable.connection import config_problems
    from durable.embedded import free_port
    from durable.testing import wait_for
    from tests.secure_servers import debian_redis

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


def test_what_the_image_copies_holds_every_package_of_the_wheel(tmp_path: Path) -> None:
    """The Dockerfile's COPY lines alone (nothing else of the checkout) hold every package
    the wheel is made of (setuptools' discovery, as pyproject.toml configures it, finds the
    same ones as in the checkout) and every package-data file: a package added to the
    project but not to the image fails here, not at a pod's start."""
    import shutil
    import tomllib

    from setuptools import find_packages

    context = tmp_path / "context"
    for op, args in _dockerfile():
        if op != "COPY":
            continue
        *sources, dest = args.split()
        for src in sources:
            target = context / (src if dest.endswith("/") else dest.removeprefix("./"))
            if (ROOT / src).is_dir():
                shutil.copytree(ROOT / src, target,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / src, target)
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = tool["packages"]["find"]["include"]
    found = set(find_packages(str(context), include=include))
    assert found == set(find_packages(str(ROOT), include=include))
    assert {"durable", "workers", "reconciler", "console", "examples.agents"} <= found
    for package, globs in tool["package-data"].items():
        for pattern in globs:
            assert list((context / package).glob(pattern)), (package, pattern)
    assert (context / "README.md").exists()  # pyproject.toml's readme
