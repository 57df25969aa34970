"""Typed settings, read once from ``DURABLE_*`` environment variables, grouped by concern.

``Settings()`` reads the environment into one model per concern (``settings.redis``,
``settings.worker``, ``settings.models``...: the fields of ``Settings``; the console's, the
A2A server's and the MCP server's groups are in ``durable.settings_doors``). Each field reads
the variable its ``validation_alias`` names (``settings.leases.ttl_ms`` is
``DURABLE_LEASE_TTL_MS``); a group can be read alone (``ModelSettings()``). The reference
(``durable config --reference``, docs/reference.md) is generated from them, in this order.

Overrides by variable name (``lease_ttl_ms=1000`` for ``DURABLE_LEASE_TTL_MS``), for tests
and embedding: ``Settings.from_env(**overrides)`` and ``settings.replace(**overrides)``.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from durable.durations import ContextRetention, Retention
from durable.errors import UsageError
from durable.settings_doors import A2ASettings, ConsoleSettings, McpSettings

#: Every group: fields are read from the variable named by their alias, and may be given
#: by field name too (``LeaseSettings(ttl_ms=1000)``).
_GROUP = SettingsConfigDict(extra="ignore", populate_by_name=True)


def default_data_dir() -> Path:
    """``$XDG_STATE_HOME/durable`` (``~/.local/state/durable``): every command's, anywhere."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "durable"


class RedisSettings(BaseSettings):
    """Connecting to Redis."""

    model_config = _GROUP

    url: str | None = Field(
        default=None, validation_alias="DURABLE_REDIS_URL",
        description="Use this server instead of the embedded one.")
    username: str | None = Field(
        default=None, validation_alias="DURABLE_REDIS_USERNAME",
        description="ACL user to authenticate as (overrides a user in DURABLE_REDIS_URL): "
        "each process runs as its role's user of deploy/users.acl.")
    password: SecretStr | None = Field(
        default=None, validation_alias="DURABLE_REDIS_PASSWORD",
        description="Password of DURABLE_REDIS_USERNAME (never printed).")
    tls_ca: Path | None = Field(
        default=None, validation_alias="DURABLE_REDIS_TLS_CA",
        description="CA certificate (PEM) that signed the server's: a rediss:// URL is "
        "verified against it (else against the system's CAs).")
    tls_cert: Path | None = Field(
        default=None, validation_alias="DURABLE_REDIS_TLS_CERT",
        description="Client certificate (PEM) for servers that require one.")
    tls_key: Path | None = Field(
        default=None, validation_alias="DURABLE_REDIS_TLS_KEY",
        description="Private key (PEM) of DURABLE_REDIS_TLS_CERT.")
    connect_timeout_s: float = Field(
        default=30.0, ge=0, validation_alias="DURABLE_CONNECT_TIMEOUT_S",
        description="How long to wait for DURABLE_REDIS_URL to answer.")


class ClusterSettings(BaseSettings):
    """Cluster, queue server and replicas."""

    model_config = _GROUP

    enabled: bool = Field(
        default=False, validation_alias="DURABLE_REDIS_CLUSTER",
        description="DURABLE_REDIS_URL names a node of a Redis Cluster: use the cluster "
        "client and the sharded key layout.")
    shards: int | None = Field(
        default=None, ge=0, le=1024, validation_alias="DURABLE_SHARDS",
        description="Index shards of the key layout, fixed for the life of the data (0: the "
        "unsharded single-server layout). Default: 16 on a cluster, else 0.")
    queue_url: str | None = Field(
        default=None, validation_alias="DURABLE_QUEUE_URL",
        description="Plain Redis for RQ's commands and the ready lists (default: the log's "
        "server; required with DURABLE_REDIS_CLUSTER, RQ does not run on a cluster).")
    min_replicas: int = Field(
        default=0, ge=0, validation_alias="DURABLE_MIN_REPLICAS",
        description="Acknowledge an append only after WAIT confirms this many replicas have "
        "it (and WAITAOF, on Redis >= 7.2, that they wrote it to their AOF).")
    replica_timeout_ms: int = Field(
        default=2000, ge=1, validation_alias="DURABLE_REPLICA_TIMEOUT_MS",
        description="How long an append waits for DURABLE_MIN_REPLICAS before failing.")
    region: str = Field(
        default="", pattern=r"^[A-Za-z0-9_.-]{0,64}$", validation_alias="DURABLE_REGION",
        description="This process's region: it acquires runs only while its region owns "
        "them (`durable region`). Empty: regions are off.")

    @property
    def layout_shards(self) -> int:
        """The shard count of the key layout (``durable.log.keys``)."""
        if self.shards is not None:
            return self.shards
        return 16 if self.enabled else 0


class ServerSettings(BaseSettings):
    """The embedded server."""

    model_config = _GROUP

    data_dir: Path = Field(
        default_factory=lambda: default_data_dir(), validation_alias="DURABLE_DATA_DIR",
        description="Embedded server's data and address file: one per user by default, so "
        "every command finds the same server from any directory.")
    port: int = Field(
        default=0, ge=0, le=65535, validation_alias="DURABLE_REDIS_PORT",
        description="Port of the embedded server `durable redis` starts (also `--port`); "
        "0: a free one.")
    fsync: Literal["always", "everysec", "no"] = Field(
        default="always", validation_alias="DURABLE_FSYNC",
        description="The embedded server's appendfsync policy: `always` (every "
        "acknowledged append is on disk), `everysec` or `no`.")


class WorkerSettings(BaseSettings):
    """Workers."""

    model_config = _GROUP

    queue: str = Field(default="durable", validation_alias="DURABLE_QUEUE",
                       description="RQ queue the commands go to.")
    agents: str = Field(
        default="", validation_alias="DURABLE_AGENTS",
        description="Comma-separated modules imported to register agents and tools (none by "
        "default: a worker serves the agents it is told to load; `examples.agents` for the "
        "examples).")
    concurrency: int = Field(
        default=1024, ge=1, le=10_000, validation_alias="DURABLE_CONCURRENCY",
        description="Runs one worker process holds at once. A held run that waits on an "
        "async tool or an async agent costs no thread; sync user code runs on at most "
        "DURABLE_USER_THREADS threads (see docs/scaling.md).")
    user_threads: int = Field(
        default=1024, ge=1, le=10_000, validation_alias="DURABLE_USER_THREADS",
        description="Threads a worker's hub hands slow sync user code to at once (sync tools, "
        "decide(), waits on a deadline; a sync code agent's function runs on a thread of "
        "its own), started as needed; past it such calls wait their turn. As many as the "
        "default run slots: 1,024 runs may all wait on a blocking client at once (see "
        "docs/scaling.md).")
    driver: Literal["hub", "threads"] = Field(
        default="hub", validation_alias="DURABLE_DRIVER",
        description="How a worker drives its runs: 'hub' (one driving thread resumes every "
        "run, another takes over while agent code or a tool is slow) or 'threads' (one "
        "thread per held run); the worker's start line names the driver.")
    shutdown_grace_s: float = Field(
        default=10.0, ge=0, validation_alias="DURABLE_SHUTDOWN_GRACE_S",
        description="On SIGTERM/SIGINT, how long in-flight calls may finish before the "
        "worker hands its remaining runs back.")
    decide_timeout_ms: int = Field(
        default=30_000, ge=10, validation_alias="DURABLE_DECIDE_TIMEOUT_MS",
        description="Longest a decide() (or other agent code between steps) may run; past "
        "it the run is quarantined and the worker goes on with its other runs.")
    max_stuck_calls: int = Field(
        default=32, ge=1, validation_alias="DURABLE_MAX_STUCK_CALLS",
        description="Tool calls stuck in C (never returning after their interrupt) a worker "
        "process may carry; at this many it hands its runs back and restarts in place, "
        "which ends their threads.")
    steps_per_job: int = Field(
        default=64, ge=1, validation_alias="DURABLE_STEPS_PER_JOB",
        description="Steps a run takes before it goes to the back of the ready list, so "
        "that a long run does not keep others waiting (fairness).")
    clock_skew_ms: int = Field(
        default=250, ge=0, validation_alias="DURABLE_CLOCK_SKEW_MS",
        description="Margin added to a dispatch deadline before lookup.")
    gc_threshold: int = Field(
        default=50_000, ge=0, validation_alias="DURABLE_GC_THRESHOLD",
        description="Python's cycle collector runs in a worker once this many more objects "
        "are alive than at its last pass (0 keeps the interpreter's 700, at which it took 40 "
        "% of a worker's CPU at 5,000 held runs: docs/performance.md).")


class LeaseSettings(BaseSettings):
    """Leases and liveness."""

    model_config = _GROUP

    ttl_ms: int = Field(default=5000, ge=200, validation_alias="DURABLE_LEASE_TTL_MS",
                        description="Lease time to live.")
    liveness_ttl_ms: int = Field(
        default=600, ge=100, validation_alias="DURABLE_LIVENESS_TTL_MS",
        description="A worker's liveness key lives this long and is set again every third "
        "of it; the reconciler looks every sixth and, once a worker's key is gone, releases "
        "that worker's leases at once (its runs resume elsewhere without waiting for "
        "DURABLE_LEASE_TTL_MS). A worker paused for longer loses its runs, never its "
        "fencing: a write after that is refused.")


class LogSettings(BaseSettings):
    """The log."""

    model_config = _GROUP

    checkpoint_every: int = Field(
        default=200, ge=10, validation_alias="DURABLE_CHECKPOINT_EVERY",
        description="A checkpoint event every K events: recovery folds from the last one.")
    action_window: int = Field(default=32, ge=4, validation_alias="DURABLE_ACTION_WINDOW",
                               description="Settled actions kept in the folded state.")
    retention: Retention = Field(
        default=None, validation_alias="DURABLE_RETENTION",
        description="How long a terminal run's keys live (e.g. 30d, 12h); unset = forever.")
    context_retention: ContextRetention = Field(
        default=None, validation_alias="DURABLE_CONTEXT_RETENTION", description="How long "
        "an ended run's model context stays beside it (<= DURABLE_RETENTION); unset: inline.")
    max_pending_runs: int | None = Field(
        default=None, ge=1, validation_alias="DURABLE_MAX_PENDING_RUNS",
        description="Refuse new runs while this many runs are pending (unset = no limit).")


class TenantSettings(BaseSettings):
    """Tenants."""

    model_config = _GROUP

    required: bool = Field(
        default=False, validation_alias="DURABLE_REQUIRE_TENANT",
        description="Refuse a start that names no tenant (durable.flow.tenants).")
    in_metrics: int = Field(
        default=50, ge=0, validation_alias="DURABLE_METRIC_TENANTS",
        description="Tenants that get their own label in the metrics (the first seen); the "
        "others are counted as 'other'.")


class PayloadSettings(BaseSettings):
    """Payloads and large results."""

    model_config = _GROUP

    max_payload_bytes: int = Field(
        default=256 * 1024, ge=1024, validation_alias="DURABLE_MAX_PAYLOAD_BYTES",
        description="Largest argument; inline limit of a run's input and of a result: a "
        "larger one is kept whole beside the run (dx:{R}:blobs), the log holding its reference.")
    max_result_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, validation_alias="DURABLE_MAX_RESULT_BYTES",
        description="Ceiling of a step's result, a run's result or input: past it the step "
        "fails (PayloadTooLarge), the run fails (result_too_large), or the start is refused.")
    blob_budget_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, validation_alias="DURABLE_BLOB_BUDGET_BYTES",
        description="Bytes of large values (results, its input) one run may keep beside "
        "its log: a result that would go over it fails its step with PayloadTooLarge.")
    partial_keep_bytes: int = Field(
        default=1024 * 1024, ge=0, validation_alias="DURABLE_PARTIAL_KEEP_BYTES",
        description="Partial output (ctx.emit) kept per step in flight for followers that "
        "join late; the oldest is dropped beyond it, all of it when the step ends.")


class CancelSettings(BaseSettings):
    """Cancellation."""

    model_config = _GROUP

    secret: str | None = Field(
        default=None, validation_alias="DURABLE_CANCEL_SECRET",
        description="Shared secret: published cancels must carry its HMAC.")
    max_age_ms: int = Field(
        default=5000, ge=100, validation_alias="DURABLE_CANCEL_MAX_AGE_MS",
        description="With a cancel secret: a signed cancel message is accepted only this "
        "long after its `ts` (and only once within that window).")
    report_interval_s: float = Field(
        default=10.0, gt=0, validation_alias="DURABLE_CANCEL_REPORT_INTERVAL_S",
        description="Rejected cancel messages (forged, malformed, stale, replayed) are "
        "counted and logged once per this interval per process, never one line each.")
    grace_ms: int = Field(default=1000, ge=0, validation_alias="DURABLE_CANCEL_GRACE_MS",
                          description="How long a tool may take to honour a cancel.")


class SecuritySettings(BaseSettings):
    """Keys, approvals and sealing."""

    model_config = _GROUP

    admin_keys: str | None = Field(
        default=None, validation_alias="DURABLE_ADMIN_KEYS",
        description="Public keys of the approver registry's admins, comma-separated: each a "
        "key file (PEM or OpenSSH) or a key inline (base64 of the raw 32 bytes, or "
        "'ssh-ed25519 AAAA...'). An approver entry counts only with a signature by one of "
        "them; unset, no approval can be trusted. Rotate by listing the new key beside the "
        "old, `durable approvers resign`, then dropping the old.")
    approvers: dict[str, list[str]] = Field(
        default_factory=dict, validation_alias="DURABLE_APPROVERS",
        description="Retired: grants nothing (read only so that an old environment still "
        "parses). Approvers are keys an operator registers: `durable approvers add`.")
    settle_role: str = Field(
        default="operator", min_length=1, validation_alias="DURABLE_SETTLE_ROLE",
        description="The role a registered key needs to settle an unknown outcome "
        "(`durable settle`): its signed decision is recorded and checked like an approval.")
    seal_key: str | None = Field(
        default=None, validation_alias="DURABLE_SEAL_KEY",
        description="Ed25519 private key file (PEM or OpenSSH) sealing the runs this process "
        "ends or holds (a signature over the log's chain head, checked by `durable verify`); its "
        "public half registered with the role `sealer` under DURABLE_SEAL_SIGNER, or the "
        "process refuses to start. Unset: verify says 'unsealed (chain only)'.")
    seal_signer: str | None = Field(
        default=None, validation_alias="DURABLE_SEAL_SIGNER",
        description="The registry name of DURABLE_SEAL_KEY's public key (`durable approvers "
        "add NAME --role sealer`).")
    seal_every: int = Field(
        default=100, ge=0, validation_alias="DURABLE_SEAL_EVERY",
        description="With DURABLE_SEAL_KEY: a running run is sealed by its lease holder every "
        "this many entries (and when a job leaves it waiting); 0: only then.")
    seal_interval_ms: int = Field(
        default=30_000, ge=0, validation_alias="DURABLE_SEAL_INTERVAL_MS",
        description="With DURABLE_SEAL_KEY: a running run is sealed at its first append this "
        "long after its last seal; 0: never by time.")
    encryption_keys: SecretStr | None = Field(
        default=None, validation_alias="DURABLE_ENCRYPTION_KEYS",
        description="Keys that seal sensitive fields, as id:base64key,... (32-byte keys; the "
        "first seals, all open): rotate by putting a new key first.")


class ReconcilerSettings(BaseSettings):
    """The reconciler."""

    model_config = _GROUP

    interval_s: float = Field(
        default=0.5, gt=0, validation_alias="DURABLE_RECONCILE_INTERVAL_S",
        description="Seconds between two reconciler sweeps (unknown outcomes, expired "
        "leases and waits, timers, schedules).")


class ModelSettings(BaseSettings):
    """The model step (``durable.models``'s ``chat`` tool): where the model is. The step
    reads it at each call, except the fleet-wide limits, read at import."""

    model_config = _GROUP

    base_url: str = Field(default="https://api.openai.com/v1",
                          validation_alias="DURABLE_MODEL_BASE_URL",
                          description="OpenAI-compatible API base URL (.../v1).")
    api_key: SecretStr | None = Field(default=None, validation_alias="DURABLE_MODEL_API_KEY",
                                      description="Sent as a Bearer token.")
    name: str = Field(default="gpt-4o-mini", validation_alias="DURABLE_MODEL_NAME",
                      description="The request's model field.")
    timeout_s: float = Field(
        default=60.0, gt=0, validation_alias="DURABLE_MODEL_TIMEOUT_S",
        description="A chat step's timeout, unless the call gives its own `timeout_s`.")
    stream: bool = Field(default=False, validation_alias="DURABLE_MODEL_STREAM",
                         description="Stream replies (SSE) by default.")
    attempts: int = Field(
        default=3, ge=1, validation_alias="DURABLE_MODEL_ATTEMPTS",
        description="Most requests one chat step sends (timed out, refused with 429/5xx or "
        "lost), unless the call gives its own `max_attempts`; each counts as a model call.")
    max_retry_after_s: float = Field(
        default=300.0, ge=0, validation_alias="DURABLE_MODEL_MAX_RETRY_AFTER_S",
        description="The longest `Retry-After` honoured; a longer one is cut to it.")
    rpm: int = Field(default=0, ge=0, validation_alias="DURABLE_MODEL_RPM",
                     description="Requests per minute the whole fleet may send (the "
                     "provider's quota; 0: no limit; read at import).")
    tpm: int = Field(default=0, ge=0, validation_alias="DURABLE_MODEL_TPM",
                     description="Tokens per minute the whole fleet may use (0: no limit; "
                     "read at import).")
    in_flight: int = Field(default=0, ge=0, validation_alias="DURABLE_MODEL_IN_FLIGHT",
                           description="Requests in flight at once across the fleet (0: no "
                           "limit; read at import).")


class Settings(BaseModel):
    """Every knob, by concern (``Settings()`` reads each group); titles head the reference."""

    redis: RedisSettings = Field(default_factory=RedisSettings, title="Connecting to Redis")
    cluster: ClusterSettings = Field(default_factory=ClusterSettings,
                                     title="Cluster, queue server and replicas")
    server: ServerSettings = Field(default_factory=ServerSettings, title="The embedded server")
    worker: WorkerSettings = Field(default_factory=WorkerSettings, title="Workers")
    leases: LeaseSettings = Field(default_factory=LeaseSettings, title="Leases and liveness")
    log: LogSettings = Field(default_factory=LogSettings, title="The log")
    tenants: TenantSettings = Field(default_factory=TenantSettings, title="Tenants")
    payloads: PayloadSettings = Field(default_factory=PayloadSettings,
                                      title="Payloads and large results")
    cancel: CancelSettings = Field(default_factory=CancelSettings, title="Cancellation")
    security: SecuritySettings = Field(default_factory=SecuritySettings,
                                       title="Keys, approvals and sealing")
    reconciler: ReconcilerSettings = Field(default_factory=ReconcilerSettings,
                                           title="The reconciler")
    console: ConsoleSettings = Field(default_factory=ConsoleSettings, title="The console")
    a2a: A2ASettings = Field(default_factory=A2ASettings, title="The A2A server")
    mcp: McpSettings = Field(default_factory=McpSettings, title="The MCP server")
    models: ModelSettings = Field(default_factory=ModelSettings, title="The model step")

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """The environment's settings, ``overrides`` (by variable name: ``lease_ttl_ms=1000``
        for ``DURABLE_LEASE_TTL_MS``) taking precedence, validated as the environment is."""
        types = _group_types()
        return cls.model_validate({name: types[name](**values)
                                   for name, values in _by_group(overrides).items()})

    def replace(self, **overrides: Any) -> Settings:
        """A copy with ``overrides`` (by variable name, as ``from_env``), validated; the
        environment is not read again."""
        changed = {}
        for name, values in _by_group(overrides).items():
            group: BaseSettings = getattr(self, name)
            changed[name] = type(group).model_validate({**group.model_dump(), **values})
        return self.model_copy(update=changed)


def variables() -> dict[str, tuple[str, str]]:
    """Each setting's variable -> (its group, its field in the group), in reference order."""
    return dict(_variables())


@cache
def _variables() -> tuple[tuple[str, tuple[str, str]], ...]:
    return tuple((str(field.validation_alias), (group, name))
                 for group, group_type in _group_types().items()
                 for name, field in group_type.model_fields.items())


@cache
def _group_types() -> dict[str, type[BaseSettings]]:
    """Each group's name in ``Settings`` -> its type (every field of ``Settings`` is one)."""
    return {name: cast(type[BaseSettings], field.annotation)
            for name, field in Settings.model_fields.items()}


def _by_group(overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``overrides`` by variable name -> field values by group; an unknown name is refused."""
    known = dict(_variables())
    out: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        var = "DURABLE_" + key.upper()
        if var not in known:
            raise UsageError(f"no setting {var} (see `durable config --reference`)")
        group, field = known[var]
        out.setdefault(group, {})[field] = value
    return out
