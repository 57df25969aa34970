"""One MCP session per server and worker process, reused across steps, reopened when the
server died (``durable.integrations.mcp`` for code agents, ``pydantic_ai.mcp`` and
``openai_agents.mcp`` for the frameworks).

A session lives on the steps' event loop (the process's, ``durable.integrations.base``): it
is opened by the first step that needs it and stays open while the server answers. A stdio
server that died (killed, crashed, out of memory) closes the session's streams; what a step
does then depends on what it knows:

- before a call with an effect, the session is pinged (any answer, even an error, says the
  server lives): a dead one is closed and opened again
  (a new server process), so a server that died between two calls costs nothing;
- a call whose connection closed while it was in flight may have reached the server: the step
  raises ``OutcomeUnknown`` (resolved by its ``lookup``, never sent again blindly) and the
  next step opens a new session;
- an effect-free call (the tool list, a read-only tool) is sent again once on a new session.

A stdio server dies with the worker that started it (``dying_with_worker``): a worker
SIGKILLed, or killed by the OOM killer, leaves no server behind, even one that does not exit
when its stdin closes (busy in a call, or holding work of its own) or that runs its server in
a child process (``npx``, ``uvx``, a shell). On Linux the server is started by a small
launcher that asks the kernel for a signal when the worker dies (``PR_SET_PDEATHSIG``) and
then kills the server's whole process group; elsewhere it is started as the MCP SDK starts
it, and outlives a killed worker until it notices its stdin closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import anyio

from durable.agents import OutcomeUnknown, ToolContext
from durable.errors import causes

__all__ = ["META_DEADLINE", "META_KEY", "SESSIONS", "McpSession", "Sessions", "connection_lost",
           "dying_with_worker", "read_only", "step_meta"]

T = TypeVar("T")

#: The JSON-RPC error code of a closed connection (the MCP SDK's ``CONNECTION_CLOSED``).
CONNECTION_CLOSED = -32000
#: How long a liveness ping may take before the session counts as dead.
PING_TIMEOUT_S = 5.0
#: How long closing a dead session may take before it is left to itself.
CLOSE_TIMEOUT_S = 5.0
#: Where a call's idempotency key and deadline travel in its ``_meta``.
META_KEY, META_DEADLINE = "idempotency_key", "deadline_ms"


def step_meta(ctx: ToolContext) -> dict[str, Any]:
    """What a call's ``_meta`` carries for the server to deduplicate on: the step's
    idempotency key and deadline."""
    return {META_KEY: ctx.key, META_DEADLINE: ctx.deadline_ms}


def read_only(listed: dict[str, Any]) -> bool:
    """Whether a tool of a recorded tool list (MCP's JSON of a tool) is marked read-only: its
    calls are then effect-free steps."""
    return bool((listed.get("annotations") or {}).get("readOnlyHint"))


class McpSession(Protocol):
    """What a pooled session is: an async context manager (entered once, exited when dead)."""

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: Any) -> Any: ...


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the connection to the server is gone: the MCP
    SDK's "Connection closed", a closed or broken stream, a broken pipe. A tool's own error,
    or a timeout, is not."""
    for cur in causes(exc):
        if isinstance(cur, anyio.ClosedResourceError | anyio.BrokenResourceError
                      | anyio.EndOfStream | BrokenPipeError | ConnectionResetError):
            return True
        error = getattr(cur, "error", None)  # mcp.shared.exceptions.MCPError's ErrorData
        if getattr(error, "code", None) == CONNECTION_CLOSED:
            return True
        if getattr(cur, "code", None) == CONNECTION_CLOSED:
            return True
    return False


@dataclass
class _Slot:
    session: Any = None
    #: Set to close the open session (its host task leaves the context it entered).
    closing: asyncio.Event | None = None
    host: asyncio.Task[None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: How often a session was opened for this server in this process.
    opened: int = 0


async def _host(session: McpSession, entered: asyncio.Future[None], closing: asyncio.Event) -> None:
    """Enter ``session`` and leave it in this one task (anyio's task groups, which stdio
    clients open, must be left by the task that entered them), when ``closing`` is set."""
    try:
        await session.__aenter__()
    except BaseException as exc:
        if not entered.done():
            entered.set_exception(exc)
        return
    entered.set_result(None)
    try:
        await closing.wait()
    finally:
        with contextlib.suppress(Exception):
            await session.__aexit__(None, None, None)


class Sessions:
    """The open sessions of one process, by server name. Use only on the steps' loop."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}

    def opened(self, name: str) -> int:
        slot = self._slots.get(name)
        return slot.opened if slot is not None else 0

    async def _get(self, name: str, make: Callable[[], McpSession]) -> Any:
        slot = self._slots.setdefault(name, _Slot())
        async with slot.lock:
            if slot.session is None:
                session = make()
                entered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                closing = asyncio.Event()
                host = asyncio.ensure_future(_host(session, entered, closing))
                await entered
                slot.session, slot.closing, slot.host = session, closing, host
                slot.opened += 1
            return slot.session

    async def drop(self, name: str, session: Any) -> None:
        """Close ``session`` (a dead one: its errors are of no interest) if it is the open one."""
        slot = self._slots.get(name)
        if slot is None or slot.session is not session:
            return
        closing, host = slot.closing, slot.host
        slot.session, slot.closing, slot.host = None, None, None
        if closing is not None and host is not None:
            closing.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(host), CLOSE_TIMEOUT_S)

    async def call(self, name: str, make: Callable[[], McpSession],
                   use: Callable[[Any], Awaitable[T]], *,
                   ping: Callable[[Any], Awaitable[Any]], effect: bool) -> T:
        """``use(session)`` on the open session of ``name`` (``make()`` makes one), by the
        rules of the module's docstring: ``effect`` calls ping first and raise
        ``OutcomeUnknown`` when the connection closes under them; others are sent again once."""
        session = await self._get(name, make)
        if effect:
            try:
                with anyio.fail_after(PING_TIMEOUT_S):
                    await ping(session)
            except Exception as exc:
                # An error the server sent back (some refuse ``ping``) says it is alive.
                if connection_lost(exc) or isinstance(exc, TimeoutError):
                    await self.drop(name, session)
                    session = await self._get(name, make)
        try:
            return await use(session)
        except Exception as exc:
            if not connection_lost(exc):
                raise
            await self.drop(name, session)
            if effect:
                raise OutcomeUnknown(f"the connection to the MCP server {name!r} closed during "
                                     "the call: it may have been applied") from exc
        return await use(await self._get(name, make))


#: The sessions of this process.
SESSIONS = Sessions()


# Stdio servers that die with the worker -------------------------------------------------------
#
# The MCP SDK starts a stdio server in a session of its own (``start_new_session``), so nothing
# reaches it when the worker is SIGKILLed but its stdin closing. The launcher, run by this
# interpreter in place of the server (``-I -S``: nothing of the environment's Python, no site),
# is that session's leader: it asks for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``),
# forks the server (which asks for SIGKILL when the launcher dies) and waits for it, its own
# stdin and stdout on /dev/null so that the server's pipes close when the server exits. The
# death signal comes when the *thread* that forked the launcher ends (the steps' loop thread,
# which lives as long as the worker), and the SDK's own shutdown SIGTERMs the group: the
# launcher kills the group only once its parent process is another than the worker's.

_LAUNCHER = """\
import ctypes, os, signal, sys
worker, argv, me = int(sys.argv[1]), sys.argv[2:], os.getpid()
prctl = ctypes.CDLL(None).prctl
if os.getpgid(0) != me:
    os.setpgid(0, 0)
def gone(*_):
    if os.getpid() == me and os.getppid() != worker:
        os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, gone)
prctl(1, signal.SIGTERM)
gone()
child = os.fork()
if child == 0:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    prctl(1, signal.SIGKILL)
    if os.getppid() != me:
        os._exit(1)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"cannot start the MCP server {argv[0]!r}: {exc}", file=sys.stderr)
    os._exit(127)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0)
os.dup2(null, 1)
code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
sys.exit(code if code >= 0 else 128 - code)
"""
_PREFIX = ["-I", "-S", "-c", _LAUNCHER]
#: Whether this platform has a parent-death signal (Linux's ``prctl``).
LAUNCHES = sys.platform == "linux" and bool(sys.executable)


def dying_with_worker(spec: Any) -> Any:
    """Make the stdio server ``spec`` describes die with this process (see the section's
    comment), and return it: ``spec`` is what holds the server's ``command``, ``args`` and
    ``env`` (the MCP SDK's ``StdioServerParameters``, fastmcp's ``StdioTransport``); anything
    else (a URL, an HTTP transport, ``None``) is returned untouched. Call it before each
    session is opened: the launcher is told this process's id, which a forked process
    does not share. A command not on the server's ``PATH`` is left for the SDK to refuse
    with its own error. Without a parent-death signal (not Linux) nothing changes."""
    command, args = getattr(spec, "command", None), getattr(spec, "args", None)
    if not LAUNCHES or not isinstance(command, str) or not isinstance(args, list):
        return spec
    if command == sys.executable and args[:len(_PREFIX)] == _PREFIX:
        command, args = args[len(_PREFIX) + 1], args[len(_PREFIX) + 2:]
    env = getattr(spec, "env", None) or {}
    if os.sep not in command and shutil.which(command, path=env.get("PATH")
                                              or os.environ.get("PATH")) is None:
        spec.command, spec.args = command, list(args)
        return spec
    spec.command, spec.args = sys.executable, [*_PREFIX, str(os.getpid()), command, *args]
    return spec
