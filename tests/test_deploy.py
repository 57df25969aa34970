"""What an operator copies must pass the project's own connect-time safety check."""

from __future__ import annotations

from pathlib import Path

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


def test_procfile_runs_the_project_processes() -> None:
    lines = dict(line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines())
    assert lines["worker"].strip().endswith("durable worker")
    assert lines["reconciler"].strip().endswith("durable reconciler")
    assert lines["redis"].strip().startswith("durable redis")


def test_honcho_runs_the_procfile_with_scaled_workers(tmp_path: Path) -> None:
    """`honcho start -c worker=2`: the embedded server, two workers and the reconciler;
    a run started from outside (through the address the server recorded) completes."""
    import os
    import signal
    import subprocess
    import sys

    from durable.embedded import free_port
    from durable.testing import wait_for

    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    env["DURABLE_PORT"] = str(free_port())
    env["DURABLE_AGENTS"] = "examples.agents"
    env["DURABLE_DATA_DIR"] = str(tmp_path / ".durable")
    # The Procfile names the `durable` script: the one installed next to this Python.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    (tmp_path / "Procfile").write_text((ROOT / "Procfile").read_text())
    honcho = subprocess.Popen([sys.executable, "-m", "honcho", "start", "-c", "worker=2"],
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
