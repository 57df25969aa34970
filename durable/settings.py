"""Typed settings, read once from ``DURABLE_*`` environment variables."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    """``$XDG_STATE_HOME/durable`` (``~/.local/state/durable``): the same for every command a
    user runs, wherever they stand."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "durable"


class Settings(BaseSettings):
    """Every knob of the system. Each field reads ``DURABLE_<NAME>`` from the environment."""

    model_config = SettingsConfigDict(env_prefix="DURABLE_", extra="ignore")

    redis_url: str | None = Field(
        default=None, description="Use this server instead of the embedded one."
    )
    redis_cluster: bool = Field(
        default=False,
        description="DURABLE_REDIS_URL names a node of a Redis Cluster: use the cluster "
        "client and the sharded key layout.",
    )
    shards: int | None = Field(
        default=None, ge=0, le=1024,
        description="Index shards of the key layout, fixed for the life of the data (0: the "
        "unsharded single-server layout). Default: 16 on a cluster, else 0.",
    )
    queue_url: str | None = Field(
        default=None,
        description="Plain Redis for RQ's commands and the ready lists (default: the log's "
        "server; required with DURABLE_REDIS_CLUSTER, RQ does not run on a cluster).",
    )
    min_replicas: int = Field(
        default=0, ge=0,
        description="Acknowledge an append only after WAIT confirms this many replicas have "
        "it (and WAITAOF, on Redis >= 7.2, that they wrote it to their AOF).",
    )
    replica_timeout_ms: int = Field(
        default=2000, ge=1,
        description="How long an append waits for DURABLE_MIN_REPLICAS before failing.",
    )
    redis_username: str | None = Field(
        default=None,
        description="ACL user to authenticate as (overrides a user in DURABLE_REDIS_URL): "
        "each process runs as its role's user of deploy/users.acl.",
    )
    redis_password: SecretStr | None = Field(
        default=None, description="Password of DURABLE_REDIS_USERNAME (never printed)."
    )
    redis_tls_ca: Path | None = Field(
        default=None, description="CA certificate (PEM) that signed the server's: a "
        "rediss:// URL is verified against it (else against the system's CAs)."
    )
    redis_tls_cert: Path | None = Field(
        default=None, description="Client certificate (PEM) for servers that require one."
    )
    redis_tls_key: Path | None = Field(
        default=None, description="Private key (PEM) of DURABLE_REDIS_TLS_CERT."
    )
    data_dir: Path = Field(
        default_factory=lambda: default_data_dir(),
        description="Embedded server's data and address file: one per user by default, so "
        "every command finds the same server from any directory.",
    )
    redis_port: int = Field(
        default=0, ge=0, le=65535,
        description="Port of the embedded server `durable redis` starts (also `--port`); "
        "0: a free one.",
    )
    fsync: Literal["always", "everysec", "no"] = Field(
        default="always", description="The embedded server's appendfsync policy: "
        "`always` (every acknowledged append is on disk), `everysec` or `no`."
    )
    queue: str = Field(default="durable", description="RQ queue the commands go to.")
    connect_timeout_s: float = Field(
        default=30.0, ge=0, description="How long to wait for DURABLE_REDIS_URL to answer."
    )
    lease_ttl_ms: int = Field(default=5000, ge=200, description="Lease time to live.")
    liveness_ttl_ms: int = Field(
        default=600, ge=100,
        description="A worker's liveness key lives this long and is set again every third "
        "of it; the reconciler looks every sixth and, once a worker's key is gone, releases "
        "that worker's leases at once (its runs resume elsewhere without waiting for "
        "DURABLE_LEASE_TTL_MS). A worker paused for longer loses its runs, never its "
        "fencing: a write after that is refused.",
    )
    concurrency: int = Field(
        default=1024, ge=1, le=10_000,
        description="Runs one worker process holds at once. A held run that waits on an "
        "async tool or an async agent costs no thread; sync user code runs on at most "
        "DURABLE_USER_THREADS threads (see docs/scaling.md).",
    )
    user_threads: int = Field(
        default=256, ge=1, le=10_000,
        description="Threads a worker's hub hands slow sync user code to at once (sync "
        "tools, decide(), sync code agents' steps, waits on a deadline); past it such calls "
        "wait their turn. Raise it for many slow sync tools, lower it for CPU-bound code.",
    )
    driver: Literal["hub", "threads"] = Field(
        default="hub",
        description="How a worker drives its runs: 'hub' (one driving thread resumes "
        "every run, another takes over while agent code or a tool is slow) or 'threads' "
        "(one thread per held run). On a cluster, or with DURABLE_MIN_REPLICAS, the "
        "worker uses threads either way.",
    )
    shutdown_grace_s: float = Field(
        default=10.0, ge=0,
        description="On SIGTERM/SIGINT, how long in-flight calls may finish before the "
        "worker hands its remaining runs back.",
    )
    decide_timeout_ms: int = Field(
        default=30_000, ge=10,
        description="Longest a decide() (or other agent code between steps) may run; past "
        "it the run is quarantined and the worker goes on with its other runs.",
    )
    max_stuck_calls: int = Field(
        default=32, ge=1,
        description="Tool calls stuck in C (never returning after their interrupt) a worker "
        "process may carry; at this many it hands its runs back and restarts in place, "
        "which ends their threads.",
    )
    steps_per_job: int = Field(
        default=64, ge=1, description="Steps a run takes before it goes to the back of "
        "the ready list, so that a long run does not keep others waiting (fairness)."
    )
    checkpoint_every: int = Field(
        default=200, ge=10, description="A checkpoint event every K events: recovery folds "
        "from the last one."
    )
    action_window: int = Field(
        default=32, ge=4, description="Settled actions kept in the folded state."
    )
    cancel_secret: str | None = Field(
        default=None, description="Shared secret: published cancels must carry its HMAC."
    )
    cancel_max_age_ms: int = Field(
        default=5000, ge=100,
        description="With a cancel secret: a signed cancel message is accepted only this "
        "long after its `ts` (and only once within that window).",
    )
    cancel_report_interval_s: float = Field(
        default=10.0, gt=0,
        description="Rejected cancel messages (forged, malformed, stale, replayed) are "
        "counted and logged once per this interval per process, never one line each.",
    )
    cancel_grace_ms: int = Field(
        default=1000, ge=0, description="How long a tool may take to honour a cancel."
    )
    clock_skew_ms: int = Field(
        default=250, ge=0, description="Margin added to a dispatch deadline before lookup."
    )
    partial_keep_bytes: int = Field(
        default=1024 * 1024, ge=0,
        description="Partial output (ctx.emit) kept per step in flight for followers that "
        "join late; the oldest is dropped beyond it, all of it when the step ends.",
    )
    max_payload_bytes: int = Field(
        default=256 * 1024, ge=1024,
        description="Largest input or argument, and the inline limit of a result: a larger "
        "one is kept whole beside the run (dx:{R}:blobs), the log holding its reference.",
    )
    max_result_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024,
        description="Hard ceiling of one step's result: past it the step fails with "
        "PayloadTooLarge (the agent sees the failure; nothing is replaced).",
    )
    blob_budget_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024,
        description="Bytes of large results one run may keep beside its log: a result "
        "that would go over it fails its step with PayloadTooLarge.",
    )
    agents: str = Field(
        default="",
        description="Comma-separated modules imported to register agents and tools "
        "(none by default: a worker serves the agents it is told to load; "
        "`examples.agents` for the examples).",
    )
    approvers: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Retired: grants nothing (read only so that an old environment still "
        "parses). Approvers are keys an operator registers: `durable approvers add`.",
    )
    admin_keys: str | None = Field(
        default=None,
        description="Public keys of the approver registry's admins, comma-separated: each a "
        "key file (PEM or OpenSSH) or a key inline (base64 of the raw 32 bytes, or "
        "'ssh-ed25519 AAAA...'). An approver entry counts only with a signature by one of "
        "them; unset, no approval can be trusted. Rotate by listing the new key beside the "
        "old, `durable approvers resign`, then dropping the old.",
    )
    settle_role: str = Field(
        default="operator", min_length=1,
        description="The role a registered key needs to settle an unknown outcome "
        "(`durable settle`): its signed decision is recorded and checked like an approval.",
    )
    reconcile_interval_s: float = Field(
        default=0.5, gt=0, description="Seconds between two reconciler sweeps (unknown "
        "outcomes, expired leases and waits, timers, schedules)."
    )
    console_users: Path | None = Field(
        default=None,
        description="The console's users file (TOML or JSON): name -> scrypt password hash "
        "and roles (viewer, operator, approver). Required unless `durable console --dev`.",
    )
    console_secret: str | None = Field(
        default=None,
        description="Key that signs the console's session cookies; unset: a random one per "
        "process (everyone logs in again after a restart).",
    )
    console_secure_cookies: bool = Field(
        default=False,
        description="Give the console's session cookie the Secure flag (browsers send it "
        "over HTTPS only) and send Strict-Transport-Security: for a console served over "
        "TLS, directly or behind a proxy. Also `durable console --secure-cookies`.",
    )

    encryption_keys: SecretStr | None = Field(
        default=None,
        description="Keys that seal sensitive fields, as id:base64key,... (32-byte keys; the "
        "first seals, all open): rotate by putting a new key first.",
    )
    retention: str | None = Field(
        default=None,
        description="How long a terminal run's keys live (e.g. 30d, 12h); unset = forever.",
    )
    max_pending_runs: int | None = Field(
        default=None, ge=1,
        description="Refuse new runs while this many runs are pending (unset = no limit).",
    )
    require_tenant: bool = Field(
        default=False, description="Refuse a start that names no tenant (durable.tenants).",
    )
    metric_tenants: int = Field(
        default=50, ge=0,
        description="Tenants that get their own label in the metrics (the first seen); the "
        "others are counted as 'other'.",
    )

    @property
    def layout_shards(self) -> int:
        """The shard count of the key layout (``durable.log.keys``)."""
        if self.shards is not None:
            return self.shards
        return 16 if self.redis_cluster else 0


#: The settings by concern, in the order the reference (``durable config --reference``,
#: docs/reference.md) shows them; every field is in exactly one group (a test checks).
GROUPS: dict[str, tuple[str, ...]] = {
    "Connecting to Redis": (
        "redis_url", "redis_username", "redis_password", "redis_tls_ca", "redis_tls_cert",
        "redis_tls_key", "connect_timeout_s"),
    "Cluster, queue server and replicas": (
        "redis_cluster", "shards", "queue_url", "min_replicas", "replica_timeout_ms"),
    "The embedded server": ("data_dir", "redis_port", "fsync"),
    "Workers": (
        "queue", "agents", "concurrency", "user_threads", "driver", "lease_ttl_ms",
        "liveness_ttl_ms", "shutdown_grace_s", "decide_timeout_ms", "max_stuck_calls",
        "steps_per_job", "clock_skew_ms"),
    "The log": ("checkpoint_every", "action_window", "retention", "max_pending_runs"),
    "Tenants": ("require_tenant", "metric_tenants"),
    "Payloads and large results": (
        "max_payload_bytes", "max_result_bytes", "blob_budget_bytes", "partial_keep_bytes"),
    "Cancellation": (
        "cancel_secret", "cancel_max_age_ms", "cancel_report_interval_s", "cancel_grace_ms"),
    "Keys, approvals and sealing": (
        "admin_keys", "approvers", "settle_role", "encryption_keys"),
    "The reconciler": ("reconcile_interval_s",),
    "The console": ("console_users", "console_secret", "console_secure_cookies"),
}
