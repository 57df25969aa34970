"""The fork server the tests' processes come from (``durable.testing.forks``): a forked
``durable`` command must be what ``python -m durable`` would have been — the same output
and exit code from the same environment, a process of its own session that a signal stops
or kills for real — and nothing it forked may outlive the test process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from durable.testing import Server, Worker, env_for, forks, wait_for


@pytest.fixture(autouse=True)
def _forking(monkeypatch: pytest.MonkeyPatch) -> None:
    if not forks.forking():  # DURABLE_TEST_EXEC=1: the suite does not fork, this file does
        monkeypatch.setattr(forks, "_server", forks.ForkServer(()))


@pytest.mark.parametrize("args", [("config", "--json"), ("runs", "--json"), ("nosuch",),
                                  ("status", "no-such-run")])
def test_a_forked_command_says_and_exits_as_python_m_durable_does(
    server: Server, tmp_path: Path, args: tuple[str, ...]
) -> None:
    """The same command, environment and working directory, forked and started with
    ``python -m durable``: the same standard output, standard error and exit code. The
    environment is the request's, not the fork server's (``DURABLE_CONCURRENCY``)."""
    env = env_for(server.url, DURABLE_CONCURRENCY="7", COLUMNS="120")
    forked = forks.run(args, env, cwd=tmp_path)
    started = subprocess.run([sys.executable, "-m", "durable", *args], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (started.returncode, started.stdout, started.stderr)
    if args[0] == "config":
        shown = {row["variable"]: row["value"] for row in json.loads(forked.stdout)}
        assert shown["DURABLE_CONCURRENCY"] == "7"


def test_a_forked_worker_is_a_process_of_its_own_session_stopped_and_killed_for_real(
    server: Server, tmp_path: Path
) -> None:
    """A forked worker leads a session of its own (a signal to the test's group misses
    it); SIGSTOP stops it, SIGCONT resumes it, SIGKILL ends it with -9, as
    ``subprocess`` reports a killed child."""
    log = tmp_path / "worker.log"
    w = Worker(server.url, log_path=log, DURABLE_AGENTS="tests.agents.basic")
    assert w.started(30), log.read_text()
    assert os.getsid(w.pid) == w.pid
    proc = psutil.Process(w.pid)
    w.send(signal.SIGSTOP)
    assert wait_for(lambda: proc.status() == psutil.STATUS_STOPPED, 10)
    w.send(signal.SIGCONT)
    assert wait_for(lambda: proc.status() != psutil.STATUS_STOPPED, 10)
    assert w.alive()
    w.kill()
    assert w.proc.returncode == -signal.SIGKILL
    assert not w.alive()


def test_a_forked_worker_stopped_with_sigterm_exits_cleanly(server: Server, tmp_path: Path) -> None:
    """SIGTERM: the worker's own handler runs (it logs its stop) and it exits 0."""
    log = tmp_path / "worker.log"
    w = Worker(server.url, log_path=log, DURABLE_AGENTS="tests.agents.basic")
    assert w.started(30), log.read_text()
    w.send(signal.SIGTERM)
    assert w.wait(30) == 0, log.read_text()


def test_what_the_fork_server_forked_ends_with_the_process_that_asked(
    server: Server, tmp_path: Path
) -> None:
    """Window: a test process dies with a worker of its own still running. The fork server
    reads its parent's end of a pipe: at the parent's exit it kills what it forked and
    exits, leaving no worker to take another test's runs."""
    script = textwrap.dedent(f"""
        import os, sys
        from durable.testing import Worker, forks
        forks.use_fork_server()
        w = Worker({server.url!r}, DURABLE_AGENTS="tests.agents.basic")
        print(w.pid, forks._server.proc.pid, flush=True)
        os._exit(0)  # no cleanup: as a test process that was killed
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).parent.parent)
    worker_pid, server_pid = (int(n) for n in out.stdout.split())

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert wait_for(lambda: gone(worker_pid) and gone(server_pid), 20)
