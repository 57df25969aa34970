"""A throwaway PostgreSQL cluster for the comparisons that need one (DBOS in ``iobound``).

``local_postgres()`` runs ``initdb`` in a temp dir and starts the server on a random
loopback port (``listen_addresses=127.0.0.1``, its socket in the same temp dir, trust
authentication for the local user), yields the URL of a database named ``bench``, then stops
the server and removes the directory. PostgreSQL refuses to run as root: as root, the
cluster belongs to the ``postgres`` system user (Debian's ``postgresql`` package makes it)
and its commands run through ``runuser``. The binaries come from ``$PG_BIN``, else
``/usr/lib/postgresql/<newest>/bin``, else the ``PATH``.

Anything missing raises ``Unavailable`` with a reason the report prints.
Durability settings are PostgreSQL's defaults (``fsync=on``, ``synchronous_commit=on``:
each commit waits for its WAL flush, like ``appendfsync always``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


class Unavailable(RuntimeError):
    """PostgreSQL cannot be had here; the message says why."""


def _bin_dir() -> Path:
    env = os.environ.get("PG_BIN")
    if env:
        return Path(env)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb and os.path.exists(os.path.realpath(initdb)):
        return Path(os.path.realpath(initdb)).parent
    raise Unavailable("no initdb found (apt-get install postgresql, or set PG_BIN)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def local_postgres(max_connections: int = 200) -> Iterator[str]:
    bindir = _bin_dir()
    for tool in ("initdb", "pg_ctl", "createdb"):
        if not (bindir / tool).exists():
            raise Unavailable(f"{bindir / tool} is missing")
    prefix: list[str] = []
    user = pwd.getpwuid(os.getuid()).pw_name
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            raise Unavailable("running as root and there is no 'postgres' user to own the "
                              "cluster") from None
        runuser = shutil.which("runuser")
        if runuser is None:
            raise Unavailable("running as root and runuser is missing")
        prefix = [runuser, "-u", "postgres", "--"]
        user = "postgres"
    tmp = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    data = tmp / "data"
    log = tmp / "server.log"
    if prefix:
        os.chown(tmp, pw.pw_uid, pw.pw_gid)
    port = _free_port()

    def run(*args: str, timeout: float = 120) -> None:
        try:
            subprocess.run([*prefix, *args], check=True, capture_output=True, text=True,
                           timeout=timeout, cwd=tmp)
        except subprocess.CalledProcessError as exc:
            tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-3:]
            raise Unavailable(f"{Path(args[0]).name} failed: {' | '.join(tail)}") from None
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"{Path(args[0]).name}: {exc}") from None

    started = False
    try:
        run(str(bindir / "initdb"), "-D", str(data), "-U", user, "--auth=trust",
            "--encoding=UTF8", "--no-instructions")
        opts = (f"-p {port} -c listen_addresses=127.0.0.1 -k {tmp} "
                f"-c max_connections={max_connections}")
        run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w",
            "-t", "60", "start")
        started = True
        run(str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", user, "bench")
        yield f"postgresql://{user}@127.0.0.1:{port}/bench"
    finally:
        if started:
            with contextlib.suppress(Unavailable):
                run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop",
                    timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
