"""What an operator copies must pass the project's own connect-time safety check."""

from __future__ import annotations

from pathlib import Path

from durable.backend.connection import config_problems, parse_config_file

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
    data dir, the example agents (from the checkout: PYTHONPATH, as the README says), and
    the `durable` script next to this Python on PATH."""
    import os
    import sys

    from durable.backend.embedded import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    env["DURABLE_PORT"] = str(free_port())
    env["DURABLE_CONSOLE_PORT"] = str(free_port())
    env["DURABLE_AGENTS"] = "examples.agents"
    env["PYTHONPATH"] = str(ROOT)
    env["DURABLE_DATA_DIR"] = str(tmp_path / ".durable")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    (tmp_path / "Procfile.dev").write_text((ROOT / "Procfile.dev").read_text())
    return env


def test_the_production_procfile_names_no_embedded_server() -> None:
    """Production: workers, the reconciler and the console against DURABLE_REDIS_URL,
    nothing else; the console asks for a login (no --dev)."""
    assert _procfile("Procfile") == {
        "worker": "durable worker", "reconciler": "durable reconciler",
        "console": "durable console"}


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
