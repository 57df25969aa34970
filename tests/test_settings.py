"""Settings grouped by concern keep their ``DURABLE_*`` names: every variable an operator
set before still reaches its field, bad values are refused naming the variable, and the
overrides by variable name are validated like the environment's values."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from durable.cli.config import cmd_config
from durable.errors import UsageError
from durable.settings import LeaseSettings, ModelSettings, Settings, variables

#: The variables the flat settings read (and the model step's), which deployments set:
#: none may vanish or change its name.
KNOWN = (
    "DURABLE_REDIS_URL DURABLE_REDIS_CLUSTER DURABLE_SHARDS DURABLE_QUEUE_URL "
    "DURABLE_MIN_REPLICAS DURABLE_REPLICA_TIMEOUT_MS DURABLE_REDIS_USERNAME "
    "DURABLE_REDIS_PASSWORD DURABLE_REDIS_TLS_CA DURABLE_REDIS_TLS_CERT DURABLE_REDIS_TLS_KEY "
    "DURABLE_DATA_DIR DURABLE_REDIS_PORT DURABLE_FSYNC DURABLE_QUEUE DURABLE_CONNECT_TIMEOUT_S "
    "DURABLE_LEASE_TTL_MS DURABLE_LIVENESS_TTL_MS DURABLE_CONCURRENCY DURABLE_DRIVER "
    "DURABLE_SHUTDOWN_GRACE_S DURABLE_DECIDE_TIMEOUT_MS DURABLE_MAX_STUCK_CALLS "
    "DURABLE_STEPS_PER_JOB DURABLE_CHECKPOINT_EVERY DURABLE_ACTION_WINDOW DURABLE_CANCEL_SECRET "
    "DURABLE_CANCEL_MAX_AGE_MS DURABLE_CANCEL_REPORT_INTERVAL_S DURABLE_CANCEL_GRACE_MS "
    "DURABLE_CLOCK_SKEW_MS DURABLE_PARTIAL_KEEP_BYTES DURABLE_MAX_PAYLOAD_BYTES "
    "DURABLE_MAX_RESULT_BYTES DURABLE_BLOB_BUDGET_BYTES DURABLE_AGENTS DURABLE_APPROVERS "
    "DURABLE_ADMIN_KEYS DURABLE_SETTLE_ROLE DURABLE_RECONCILE_INTERVAL_S DURABLE_CONSOLE_USERS "
    "DURABLE_CONSOLE_SECRET DURABLE_CONSOLE_SECURE_COOKIES DURABLE_ENCRYPTION_KEYS "
    "DURABLE_RETENTION DURABLE_MAX_PENDING_RUNS DURABLE_REQUIRE_TENANT DURABLE_METRIC_TENANTS "
    "DURABLE_MODEL_BASE_URL DURABLE_MODEL_API_KEY DURABLE_MODEL_NAME DURABLE_MODEL_TIMEOUT_S "
    "DURABLE_MODEL_STREAM DURABLE_MODEL_ATTEMPTS DURABLE_MODEL_MAX_RETRY_AFTER_S "
    "DURABLE_MODEL_RPM DURABLE_MODEL_TPM DURABLE_MODEL_IN_FLIGHT DURABLE_CONTEXT_RETENTION "
    "DURABLE_A2A_TOKENS DURABLE_A2A_HOST DURABLE_A2A_PORT DURABLE_A2A_PUSH_SECRET DURABLE_A2A_AGENT"
).split()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in variables():
        monkeypatch.delenv(var, raising=False)


def _field(settings: Settings, var: str) -> Any:
    group, name = variables()[var]
    return getattr(getattr(settings, group), name)


def _other_value(var: str) -> tuple[str, Any]:
    """A valid value for ``var`` that is not its default: (as set in the environment, as
    read)."""
    group, name = variables()[var]
    group_type = Settings.model_fields[group].annotation
    assert group_type is not None
    field = group_type.model_fields[name]
    kind = field.annotation
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if typing.get_origin(kind) is typing.Literal:
        choice = next(c for c in typing.get_args(kind) if c != field.default)
        return choice, choice
    if kind is bool:
        return "1", True
    if kind is int:
        value = (field.default or 0) + 7
        return str(value), value
    if kind is float:
        value = (field.default or 0) + 1.5
        return str(value), value
    if kind is Path:
        return "/srv/x", Path("/srv/x")
    if kind is SecretStr:
        return "hush", SecretStr("hush")
    if var.endswith("RETENTION"):  # a duration
        return "2h", "2h"
    if kind is str:
        return "a-value", "a-value"
    assert typing.get_origin(kind) is dict, (var, kind)  # the retired approvers map
    return '{"alice": ["finance"]}', {"alice": ["finance"]}


def test_every_variable_set_before_is_still_read() -> None:
    assert sorted(set(KNOWN) - set(variables())) == []


@pytest.mark.parametrize("var", sorted(variables()))
def test_each_variable_reaches_its_field(var: str, monkeypatch: pytest.MonkeyPatch) -> None:
    default = _field(Settings(), var)
    raw, read = _other_value(var)
    monkeypatch.setenv(var, raw)
    got = _field(Settings(), var)
    assert got != default
    if isinstance(read, SecretStr):
        assert got.get_secret_value() == read.get_secret_value()
    else:
        assert got == read


def test_a_bad_value_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_LEASE_TTL_MS", "100")  # under the 200 ms floor
    with pytest.raises(ValidationError, match="DURABLE_LEASE_TTL_MS"):
        Settings()
    monkeypatch.setenv("DURABLE_LEASE_TTL_MS", "soon")
    with pytest.raises(ValidationError, match="DURABLE_LEASE_TTL_MS"):
        LeaseSettings()


def test_overrides_by_variable_name_win_and_are_validated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_LEASE_TTL_MS", "900")
    monkeypatch.setenv("DURABLE_LIVENESS_TTL_MS", "700")
    settings = Settings.from_env(lease_ttl_ms=1200, redis_url="redis://h:1/0")
    assert (settings.leases.ttl_ms, settings.leases.liveness_ttl_ms) == (1200, 700)
    assert settings.redis.url == "redis://h:1/0"
    with pytest.raises(ValidationError):
        Settings.from_env(lease_ttl_ms=10)
    with pytest.raises(UsageError, match="DURABLE_LEASE_TTL"):
        Settings.from_env(lease_ttl=1000)


def test_replace_copies_without_reading_the_environment_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings()
    monkeypatch.setenv("DURABLE_LIVENESS_TTL_MS", "700")
    other = settings.replace(lease_ttl_ms=1500, require_tenant=True)
    assert (other.leases.ttl_ms, other.leases.liveness_ttl_ms) == (1500, 600)
    assert other.tenants.required and not settings.tenants.required
    assert settings.leases.ttl_ms == 5000  # the original is untouched
    with pytest.raises(ValidationError):
        settings.replace(concurrency=0)


def test_the_layout_follows_the_cluster_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().cluster.layout_shards == 0
    monkeypatch.setenv("DURABLE_REDIS_CLUSTER", "1")
    assert Settings().cluster.layout_shards == 16
    monkeypatch.setenv("DURABLE_SHARDS", "4")
    assert Settings().cluster.layout_shards == 4


def test_a_group_reads_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model step reads its group at each call, without the rest."""
    monkeypatch.setenv("DURABLE_MODEL_NAME", "small")
    assert ModelSettings().name == "small" == Settings().models.name


def test_config_shows_each_variable_and_hides_secrets(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import json

    monkeypatch.setenv("DURABLE_CANCEL_SECRET", "do-not-print")
    monkeypatch.setenv("DURABLE_REDIS_URL", "redis://u:pw-do-not-print@h:1/0")
    monkeypatch.setenv("DURABLE_CONSOLE_PORT", "8123")
    assert cmd_config(argparse.Namespace(reference=False, json=True)) == 0
    out = capsys.readouterr().out
    assert "do-not-print" not in out
    rows = {r["variable"]: r for r in json.loads(out)}
    assert sorted(rows) == sorted(variables())
    assert rows["DURABLE_CONSOLE_PORT"] == {"group": "The console", "variable":
                                            "DURABLE_CONSOLE_PORT", "value": "8123",
                                            "from": "environment"}
    assert rows["DURABLE_CANCEL_SECRET"]["value"] == "(set)"
    assert rows["DURABLE_LEASE_TTL_MS"]["from"] == "default"
