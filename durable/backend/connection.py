"""Connecting to Redis: the embedded server or ``DURABLE_REDIS_URL``, checked for safety."""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis
import tenacity

try:  # redis-py >= 7: one driver description for every connection of a pool
    from redis.driver_info import DriverInfo

    #: redis-py otherwise builds one per new connection, reading its own package metadata
    #: from disk each time: a worker opening hundreds of connections paid for it in CPU.
    _DRIVER: dict[str, Any] = {"driver_info": DriverInfo()}
except ImportError:  # older redis-py: it takes the version from its own module
    _DRIVER = {"lib_version": redis.__version__}

from durable.errors import UnsafeRedis, UsageError
from durable.log import keys
from durable.settings import Settings

log = logging.getLogger("durable.backend")


def connect(settings: Settings, *, check: bool = True) -> redis.Redis:
    """A client for the configured server, starting the embedded one when none is set.

    With ``DURABLE_REDIS_CLUSTER`` it is redis-py's cluster client (typed as ``redis.Redis``:
    it answers the same commands, each routed to the node of its key's slot). Either way
    the settings' key layout (``KeyLayout.of(settings)``, which the log made from the same
    settings uses) is checked against the one the data was written with (``dx:layout``).
    """
    if settings.cluster.enabled:
        if not settings.redis.url:
            raise UsageError("DURABLE_REDIS_CLUSTER needs DURABLE_REDIS_URL naming a node of "
                             "the cluster")
        cluster = _connect_cluster(settings, settings.redis.url)
        if check:
            _check_safety(cluster, settings.redis.url)
        check_layout(cluster, settings.cluster.layout_shards)
        return cluster
    if settings.redis.url:
        url = settings.redis.url
    else:
        from durable.backend.embedded import ensure_server

        url = ensure_server(settings)
    # A worker's run threads each hold a connection while they talk to Redis: the pool is
    # sized from DURABLE_CONCURRENCY and waits for a free connection rather than failing
    # (redis-py's default pool refuses past 100, which a busy worker took for an outage).
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=2 * settings.worker.concurrency + 32,
        timeout=settings.redis.connect_timeout_s,
        health_check_interval=30, **connection_options(settings, url))
    client = redis.Redis(connection_pool=pool)
    if settings.redis.url:
        _wait_until_up(client, settings.redis.connect_timeout_s, url)
    if settings.redis.url and _cluster_enabled(client):
        client.close()
        raise UsageError(f"{safe_url(url)} is a Redis Cluster node: set DURABLE_REDIS_CLUSTER=1 "
                         "(and DURABLE_QUEUE_URL to a plain server for RQ)")
    if check and settings.redis.url:
        _check_safety(client, url)
    check_layout(client, settings.cluster.layout_shards)
    return client


def _cluster_enabled(client: redis.Redis) -> bool:
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except redis.ResponseError:  # INFO not allowed: the first MOVED reply will say it
        return False


def _connect_cluster(settings: Settings, url: str) -> redis.Redis:
    def make() -> Any:
        return redis.RedisCluster.from_url(
            url, max_connections=2 * settings.worker.concurrency + 32,
            socket_connect_timeout=settings.redis.connect_timeout_s or None,
            **connection_options(settings, url))

    for attempt in tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(redis.RedisClusterException | redis.ConnectionError),
        stop=tenacity.stop_after_delay(settings.redis.connect_timeout_s),
        wait=tenacity.wait_exponential(multiplier=0.05, max=1.0), reraise=True,
    ):
        with attempt:
            cluster = make()
    return cast(redis.Redis, cluster)


def connect_queue(settings: Settings, log_client: redis.Redis) -> redis.Redis:
    """The server RQ's commands and the ready lists live on: ``DURABLE_QUEUE_URL``, else the
    log's own server (refused on a cluster: RQ's transactions span many slots)."""
    if settings.cluster.queue_url:
        pool = redis.BlockingConnectionPool.from_url(
            settings.cluster.queue_url, max_connections=2 * settings.worker.concurrency + 32,
            timeout=settings.redis.connect_timeout_s, health_check_interval=30,
            **connection_options(settings, settings.cluster.queue_url))
        client = redis.Redis(connection_pool=pool)
        _wait_until_up(client, settings.redis.connect_timeout_s, settings.cluster.queue_url)
        return client
    if is_cluster(log_client):
        raise UsageError("DURABLE_QUEUE_URL must name a plain Redis server when "
                         "DURABLE_REDIS_CLUSTER is set: RQ does not run on a cluster")
    return log_client


def is_cluster(client: object) -> bool:
    return isinstance(client, redis.RedisCluster)


def check_layout(client: redis.Redis, shards: int) -> None:
    """Record the layout on first use; refuse a process configured for another one (its
    keys would not find the runs)."""
    try:
        client.set(keys.LAYOUT, shards, nx=True)
    except redis.ResponseError:  # a read-only user or replica: compare only
        pass
    found = client.get(keys.LAYOUT)
    if found is not None and int(found) != shards:
        raise UsageError(f"the data on this Redis was written with DURABLE_SHARDS="
                         f"{int(found)}, this process is configured for {shards}: set "
                         f"DURABLE_SHARDS={int(found)} (see docs/scaling.md)")


def connection_options(settings: Settings, url: str) -> dict[str, Any]:
    """redis-py connection arguments from the settings: the ACL user and its password, and
    for a ``rediss://`` URL the CA, client certificate and key. TLS files with a plain
    ``redis://`` URL are a ``UsageError``: the connection would not be encrypted."""
    options: dict[str, Any] = dict(_DRIVER)
    if settings.redis.username:
        options["username"] = settings.redis.username
    if settings.redis.password is not None:
        options["password"] = settings.redis.password.get_secret_value()
    files = {"ssl_ca_certs": settings.redis.tls_ca, "ssl_certfile": settings.redis.tls_cert,
             "ssl_keyfile": settings.redis.tls_key}
    given = {name: path for name, path in files.items() if path is not None}
    if not given:
        return options
    if urlsplit(url).scheme != "rediss":
        raise UsageError(f"DURABLE_REDIS_TLS_* is set but {safe_url(url)} is not a rediss:// "
                         "URL: the connection would not be encrypted")
    for name, path in given.items():
        if not path.is_file():
            setting = {"ssl_ca_certs": "CA", "ssl_certfile": "CERT", "ssl_keyfile": "KEY"}[name]
            raise UsageError(f"DURABLE_REDIS_TLS_{setting}: no such file: {path}")
        options[name] = str(path)
    if settings.redis.tls_cert is not None and settings.redis.tls_key is None:
        raise UsageError("DURABLE_REDIS_TLS_CERT is set without DURABLE_REDIS_TLS_KEY")
    return options


def client_url(client: redis.Redis) -> str:
    """The URL a client talks to (with its password: pass it through ``safe_url``)."""
    if is_cluster(client):
        node: Any = cast(Any, client).get_default_node()
        return f"redis://{node.host}:{node.port}/0 (cluster)"
    kw = client.connection_pool.connection_kwargs
    user = kw.get("username") or ""
    auth = f"{user}:{kw['password']}@" if kw.get("password") else (f"{user}@" if user else "")
    scheme = "rediss" if "SSL" in client.connection_pool.connection_class.__name__ else "redis"
    return f"{scheme}://{auth}{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"


def safe_url(url: str) -> str:
    """``url`` fit to print: any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _wait_until_up(client: redis.Redis, timeout_s: float, url: str = "") -> None:
    """Processes started together (the Procfile) may come up before their server does; a
    wait longer than a moment is said once on stderr."""

    def say(state: tenacity.RetryCallState) -> None:
        if state.attempt_number == 3:
            print(f"durable: waiting for Redis at {safe_url(url)} (up to {timeout_s:g} s, "
                  "DURABLE_CONNECT_TIMEOUT_S)", file=sys.stderr, flush=True)

    for attempt in tenacity.Retrying(
        # Not up yet is worth waiting for; refused credentials or certificates are not.
        retry=tenacity.retry_if_exception(_worth_waiting),
        stop=tenacity.stop_after_delay(timeout_s),
        wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
        before_sleep=say,
        reraise=True,
    ):
        with attempt:
            client.ping()


def _worth_waiting(exc: BaseException) -> bool:
    """A server that is not up yet may come up; refused credentials or a certificate that
    does not verify will not change by waiting."""
    if not isinstance(exc, redis.ConnectionError) or isinstance(exc, redis.AuthenticationError):
        return False
    return "CERTIFICATE_VERIFY_FAILED" not in str(exc)


#: The servers (by URL) this process said it could not check: said once.
_UNCHECKED: set[str] = set()


def _check_safety(client: redis.Redis, url: str) -> None:
    """Warn (``UnsafeRedis``) of what could lose acknowledged events on the server at
    ``url``; when this user may not read its settings, say so once, at debug level."""
    problems = safety_problems(client)
    if problems is None:
        if url not in _UNCHECKED:
            _UNCHECKED.add(url)
            log.debug("%s: persistence not checked: this Redis user may not run CONFIG GET "
                      "(its ACL); a process of the admin user checks it", safe_url(url))
        return
    for problem in problems:
        warnings.warn(f"{safe_url(url)}: {problem}", UnsafeRedis, stacklevel=3)


def safety_problems(client: redis.Redis) -> list[str] | None:
    """Why acknowledged events could be lost on this server (empty when safe). A user the
    server's ACL denies ``CONFIG`` (every role of ``deploy/users.acl`` but admin, by
    design) is not warned, which it could never clear: ``_check_safety`` says once, at debug
    level, that it was not checked; a server that has no ``CONFIG GET`` at all (managed services) is
    warned about, since nothing then checks it. None: denied, nothing checked."""
    cfg, denied = _config(client)
    if denied:
        return None
    if not cfg:
        # Managed services and restricted ACL users may not run CONFIG GET: say what could
        # not be checked instead of guessing.
        return ["its persistence settings cannot be read (CONFIG GET is not allowed): make "
                "sure it runs with appendonly yes and maxmemory-policy noeviction"]
    problems = []
    if cfg.get("appendonly") != "yes":
        problems.append(
            "appendonly is off: events acknowledged since the last RDB snapshot are lost "
            "on a restart (set appendonly yes)"
        )
    elif cfg.get("appendfsync") == "no":
        problems.append(
            "appendfsync no: the OS decides when events reach the disk (use always or everysec)"
        )
    policy = cfg.get("maxmemory-policy", "noeviction")
    if policy != "noeviction":
        problems.append(
            f"maxmemory-policy {policy}: Redis may evict run logs under memory pressure "
            "(set noeviction)"
        )
    return problems


def _config(client: redis.Redis) -> tuple[dict[str, str], bool]:
    """The persistence settings, and whether the server's ACL denied reading them."""
    out: dict[str, str] = {}
    for name in ("appendonly", "appendfsync", "maxmemory-policy"):
        try:
            reply: Any = client.config_get(name)
        except redis.exceptions.NoPermissionError:
            return out, True
        except redis.ResponseError:
            continue
        for key, value in reply.items():
            k = key.decode() if isinstance(key, bytes) else str(key)
            v = value.decode() if isinstance(value, bytes) else str(value)
            out[k] = v
    return out, False


def parse_config_file(text: str) -> dict[str, str]:
    """The directives of a redis.conf (last one wins), for checking deploy/redis.conf."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        out[name.lower()] = value.strip().strip('"')
    return out


def config_problems(cfg: dict[str, str]) -> list[str]:
    """The same safety check, run on a parsed configuration file."""

    class _Fake:
        def config_get(self, name: str) -> dict[str, str]:
            return {name: cfg[name]} if name in cfg else {}

    return safety_problems(_Fake()) or []
