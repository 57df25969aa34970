"""``durable`` commands forked from a server that has already imported the library, for a
test suite that starts hundreds of processes.

A ``durable worker`` spends most of its start importing: about 0.6 s of CPU for the library
and RQ, 3 s more when its agents import pydantic-ai or the OpenAI Agents SDK. A suite that
starts a process per test pays that hundreds of times, and on a busy machine the imports,
not the tests, set its length. ``use_fork_server(preload)`` makes every later
``durable.testing.Process`` and ``run()`` of this process a child forked from one fork
server (``durable.testing.forks.serve``), which imported the library and ``preload``
once: a real process of its own session, with its own pid, environment, working directory
and output, that a test can SIGKILL, SIGSTOP or SIGTERM as before. What differs from a
``python -m durable`` start is only what the fork server had imported already; tests of the
start itself (the entry point, which modules a start imports) spawn their own interpreter.

The fork server takes requests as JSON over a Unix socket of its own directory, answers
with the child's pid and, when the child ends, its exit code (negative: the signal), as
``subprocess`` reports it. It exits, killing what it forked, when its parent closes its
standard input (the parent ended).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: What a ``durable`` command imports in any case: imported once, in the fork server.
LIBRARY = ("durable.cli.main", "durable.workers.cli", "durable.workers.runtime",
           "durable.reconciler.cli", "durable.reconciler.process", "rq", "redis")


class ForkServer:
    """The fork server of this process: started at the first fork, stopped when this
    process ends (its standard input closes)."""

    def __init__(self, preload: Sequence[str]) -> None:
        self.preload = [*LIBRARY, *preload]
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def connect(self) -> socket.socket:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.address)
        return conn

    def _start(self) -> None:
        folder = tempfile.mkdtemp(prefix="durable-forks-")
        self.address = os.path.join(folder, "socket")
        setup = json.dumps({"address": self.address, "path": sys.path,
                            "preload": self.preload})
        code = "import sys; from durable.testing.forks import serve; serve(sys.argv[1])"
        self.proc = subprocess.Popen([sys.executable, "-c", code, setup],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline() != b"ready\n":
            raise RuntimeError(f"the fork server did not start (exit {self.proc.wait()})")
        atexit.register(self.stop)

    def stop(self) -> None:
        """Close its standard input: it kills what it forked and exits."""
        if self.proc is not None:
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)


_server: ForkServer | None = None


def use_fork_server(preload: Sequence[str] = ()) -> None:
    """From now on, ``durable.testing`` processes of this process are forked from a fork
    server that imported the library and ``preload`` (modules that fail to import are
    skipped: an optional extra not installed). Modules that read the environment at import
    do not belong in ``preload``: a child would see the fork server's environment."""
    global _server
    _server = ForkServer(preload)


def forking() -> bool:
    return _server is not None


class Forked:
    """A forked ``durable`` command, with the part of ``subprocess.Popen``'s interface the
    tests use (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``)."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], *,
                 stdout: Path | None = None, stderr: Path | None = None,
                 cwd: Path | None = None) -> None:
        if _server is None:
            raise RuntimeError("no fork server: call use_fork_server() first")
        self.args = ["durable", *args]
        self.returncode: int | None = None
        self.pid: int
        self._conn = _server.connect()
        request = {"args": list(args), "env": dict(env), "cwd": _str(cwd),
                   "stdout": _str(stdout), "stderr": _str(stderr)}
        self._conn.sendall(json.dumps(request).encode() + b"\n")
        self._buffer = b""
        self.pid = 0
        pid = self._line(None)
        if pid is None:
            raise RuntimeError(f"the fork server did not fork {self.args}")
        self.pid = pid

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._line(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._line(timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def _line(self, timeout: float | None) -> int | None:
        """The next number the fork server sends (the pid, then the exit code), or None
        when none came within ``timeout`` seconds."""
        while b"\n" not in self._buffer:
            if not select.select([self._conn], [], [], timeout)[0]:
                return None
            data = self._conn.recv(4096)
            if not data:
                raise RuntimeError(f"the fork server ended before {self.args} did")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        if self.pid:  # the pid came: this is the exit code, the last thing sent
            self._conn.close()
        return int(line)

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def run(args: Sequence[str], env: Mapping[str, str], *, cwd: Path | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``durable ARGS`` forked, its output captured: what ``subprocess.run(..., text=True,
    capture_output=True, timeout=...)`` gives for ``python -m durable ARGS``."""
    with tempfile.TemporaryDirectory(prefix="durable-run-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        proc = Forked(args, env, stdout=out, stderr=err, cwd=cwd)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(proc.args, code, out.read_text(), err.read_text())


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


# The fork server's side.

def serve(argument: str) -> None:
    setup: dict[str, Any] = json.loads(argument)
    sys.path[:] = setup["path"]
    for module in setup["preload"]:
        with contextlib.suppress(ImportError):
            __import__(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(setup["address"])
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C is the test runner's to handle
    signal.set_wakeup_fd(wake_w)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in selector.select():
            if key.fileobj == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _reap(children)
            elif key.fileobj is listener:
                conn, _ = listener.accept()
                request = json.loads(conn.makefile("rb").readline())
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    for other in children.values():
                        other.close()
                    conn.close()
                    _child(request)
                children[pid] = conn
                conn.sendall(b"%d\n" % pid)
            elif not os.read(sys.stdin.fileno(), 4096):  # the parent ended
                for pid in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                os.unlink(setup["address"])
                os.rmdir(os.path.dirname(setup["address"]))
                return


def _reap(children: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
            conn.close()


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become what ``python -m durable ARGS`` with the request's
    environment would be, run the command, exit with its code."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()  # its own session, as ``start_new_session=True``
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        _redirect(request["stdout"], 1)
        _redirect(request["stderr"], 2)
        if request["cwd"] is not None:
            os.chdir(request["cwd"])
        env: dict[str, str] = request["env"]
        os.environ.clear()
        os.environ.update(env)
        # As ``python -m``: the working directory first, then PYTHONPATH's entries.
        extra = [os.getcwd(), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
        sys.path[0:0] = [p for p in extra if p not in sys.path]
        sys.argv = ["durable", *request["args"]]
        # What a process re-executes to restart in place (a worker with stuck calls does).
        sys.orig_argv = [sys.executable, "-m", "durable", *request["args"]]
        from durable.cli.main import main
        try:
            code = main(request["args"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        import threading
        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]  # an exit joins its threads
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _redirect(path: str | None, fd: int) -> None:
    target = os.open(path if path is not None else os.devnull,
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, fd)
    os.close(target)

