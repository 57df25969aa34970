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
    assert lines["worker"].strip() == "durable worker"
    assert lines["reconciler"].strip() == "durable reconciler"
    assert lines["redis"].strip() == "durable redis"
