"""The binding of a ``DurableGraph``'s function to the durable run it executes: the steps it
takes, handed to the run one decision at a time, and what the log recorded of them, found by
their identity.

- **The checkpointer's journal.** The run's ``LogSaver`` adds its entries here; they are
  recorded as ``<name>.checkpoint`` steps, before any other step (a task's steps are named by
  its task id, which derives from the checkpoint's id), and a task's writes before
  ``aput_writes`` returns. Entries added within a few turns of the event loop go in one record
  (a task's writes and the checkpoint LangGraph puts right after them).
- **Steps named by their task.** A model request or a tool call is a step named by the
  LangGraph task that makes it (``current_task``: its id, which LangGraph derives from the
  checkpoint and the task's place in the graph), the task's attempt (its ``RetryPolicy``),
  the call itself and
  how many equal calls the attempt made before it. Executed again, the function finds each
  recorded step by that name, whatever order concurrent tasks make their calls in: its
  outcome comes back from the log, nothing is sent again.
- **The group a crash left open** (an effect whose outcome the log does not hold yet) is
  taken again first, at its place, as the worker's recovery asks: every other call waits
  for it.

A step from a synchronous node (which LangGraph runs on a thread of its own) is taken on the
run's event loop and waited for on that thread (``take_blocking``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.serde.types import RESUME
from langgraph.config import get_config
from langgraph.runtime import get_runtime

from durable.call_identity import args_digest, is_placeholder
from durable.code import AsyncRunContext, StepFailed
from durable.code.execution import Unwind
from durable.errors import NondeterminismError, UsageError
from durable.integrations.base import Bindings
from durable.integrations.langgraph.records import RECORD_VERSION
from durable.integrations.langgraph.run import GraphOwner, Records, live_key
from durable.integrations.langgraph.saver import LogSaver
from durable.log.state import Action
from durable.request_digest import ListDigest

__all__ = ["GATHER_TICKS", "OPEN_WAIT_S", "OUTSIDE", "RUNS", "Binding", "Task", "bound_run",
           "current_task"]

#: Turns of the event loop a batch of calls (or entries) waits for the others started with
#: its first one.
GATHER_TICKS = 3
#: How long the calls made after a crash wait for the group the crash left open to be
#: taken again (s), before the run is found nondeterministic.
OPEN_WAIT_S = 60.0


# The task a call is named by ------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """The LangGraph task the running code belongs to, as LangGraph's runtime tells it
    (``get_runtime().execution_info``): its id (which LangGraph derives from the checkpoint
    it runs from and its place in the graph: the same task has the same id when it runs
    again from that checkpoint), the attempt its ``RetryPolicy`` is at, and its node."""

    id: str
    attempt: int
    node: str


OUTSIDE = Task("-", 1, "")


def current_task() -> Task:
    """The task the running code belongs to (``OUTSIDE`` if none)."""
    try:
        info = get_runtime().execution_info
        config = get_config()
    except (RuntimeError, KeyError, AttributeError):
        return OUTSIDE
    if info is None:
        return OUTSIDE
    node = str((config.get("metadata") or {}).get("langgraph_node") or "")
    return Task(str(info.task_id), int(info.node_attempt or 1), node)


# The run's steps ----------------------------------------------------------------------------


@dataclass
class _Call:
    tool: str
    args: dict[str, Any]
    live: Any
    future: asyncio.Future[Any]
    digest: str


def _digest_of(act: Action) -> str:
    return str(act.args["_digest"]) if is_placeholder(act.args) else args_digest(act.args)


def _resumes(entry: Any) -> bool:
    """Whether a checkpointer entry holds a task's writes of an interrupt's answer: LangGraph
    saves them with the task's next writes (when it interrupts again or returns)."""
    writes = entry.get("writes") if isinstance(entry, dict) else None
    return isinstance(writes, dict) and any(w[1] == RESUME for w in writes.get("w") or ())


def _outcome(act: Action) -> Any:
    if act.status == "succeeded":
        return act.result
    raise StepFailed(act)


class Binding:
    """The durable run a ``DurableGraph``'s function is executing (a context variable)."""

    def __init__(self, owner: GraphOwner, ctx: AsyncRunContext,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.owner, self.ctx, self.loop = owner, ctx, loop
        self.saver = LogSaver(self)
        #: Recorded steps by (tool, digest of their arguments).
        self.index: dict[tuple[str, str], Action] = {}
        #: The group the crash left open (taken again first), or a record step of it.
        self.reopen: dict[int, Action] = {}
        self.reopen_record = False
        #: Entries added and not yet recorded; how many were added, and recorded.
        self.entries: list[dict[str, Any]] = []
        self.added = self.recorded = 0
        self.flushes: list[tuple[int, asyncio.Future[None]]] = []
        self.queue: list[_Call] = []
        self.arrived = asyncio.Event()
        self.issuer: asyncio.Task[None] | None = None
        self.unwound = False
        #: The waits for an interrupt's answer this execution passed, and those whose
        #: answers the recorded checkpoints hold (the waits passed when the last answer's
        #: writes were recorded).
        self.answered = self.applied = 0
        #: Equal calls of a task's attempt so far (their place among them).
        self.counts: dict[tuple[str, ...], int] = {}
        #: The incremental digests of the conversations of model requests, by node.
        self.digests: dict[str, ListDigest] = {}
        #: Held while a call is named (synchronous nodes name theirs on their threads).
        self.lock = threading.Lock()

    # What the log recorded -----------------------------------------------------------

    def load(self) -> None:
        """Read what earlier executions recorded: the checkpointer's entries into the
        saver, the other steps into the index; go past them, to the group the crash left
        open, if any."""
        acts = self.ctx.recorded_steps()
        steps = sorted(acts)
        if not steps:
            return
        if acts[steps[0]].tool != self.owner.record_step:
            raise UsageError(
                f"run {self.ctx.run_id} was recorded by an earlier version of the LangGraph "
                f"integration (its first step is {acts[steps[0]].tool!r}, not a checkpoint):"
                " this version resumes a graph from LangGraph's checkpoints, which its log "
                "does not hold; finish it with the version that started it, or cancel it")
        for step in steps:
            act = acts[step]
            if act.tool == self.owner.record_step:
                if act.status == "succeeded":
                    self._load_record(step, act.result)
            elif act.tool.startswith(f"{self.owner.name}."):
                self.index[(act.tool, _digest_of(act))] = act
        last = acts[steps[-1]]
        group = last.group or last.step
        members = [acts[s] for s in steps if (acts[s].group or s) == group]
        through = steps[-1]
        if not all(m.settled for m in members):
            through = members[0].step - 1
            if last.tool == self.owner.record_step:
                self.reopen_record = True
            else:
                self.reopen = {m.step: m for m in members}
        self.ctx.skip_recorded(through)

    def _load_record(self, step: int, data: Any) -> None:
        if not isinstance(data, dict) or data.get("v") != RECORD_VERSION:
            raise UsageError(f"run {self.ctx.run_id}: step {step} holds checkpoints of "
                             f"another version ({str(data)[:80]!r}); this one reads version "
                             f"{RECORD_VERSION}")
        try:
            for entry in data.get("entries") or ():
                self.saver.load(entry)
                if _resumes(entry):  # the answers so far are in the checkpoints now
                    self.applied = max(self.applied, int(data.get("answered") or 0))
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"run {self.ctx.run_id}: step {step} holds a checkpoint entry "
                             f"that cannot be read: {exc}") from None

    # The checkpointer's journal -------------------------------------------------------

    def add(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)
        self.added += 1

    async def flush(self) -> None:
        """Return once every entry added so far is recorded."""
        if self.recorded >= self.added:
            return
        if self.unwound:
            raise Unwind
        done: asyncio.Future[None] = self.loop.create_future()
        self.flushes.append((self.added, done))
        self._start()
        await done

    async def _record(self) -> None:
        entries, self.entries = self.entries, []
        upto, self.reopen_record = self.added, False
        data = {"v": RECORD_VERSION, "answered": self.answered, "entries": entries}
        with self.owner.live.handing(live_key(self.ctx.run_id, self.owner.record_step, {}),
                                     Records(data)):
            await self.ctx.call(self.owner.record_step, {})
        self.recorded = upto
        waiting, self.flushes = self.flushes, []
        for target, done in waiting:
            if target <= upto:
                if not done.done():
                    done.set_result(None)
            else:
                self.flushes.append((target, done))

    # Steps -----------------------------------------------------------------------------

    def place(self, *names: str) -> int:
        """How many equal calls (``names``: the task, its attempt, the call) were made
        before this one."""
        with self.lock:
            n = self.counts.get(names, 0)
            self.counts[names] = n + 1
        return n

    def reset(self) -> None:
        """The graph is invoked again (in this execution): its tasks count their calls
        anew, as they did in the execution that recorded them."""
        self.counts.clear()

    async def take(self, tool: str, args: dict[str, Any], live: Any) -> Any:
        """The step ``tool`` with ``args`` (named by its task): its recorded outcome when
        the log holds it, else taken, ``live`` handed to the step tool."""
        digest = args_digest(args)
        act = self.index.get((tool, digest))
        if act is not None and act.step not in self.reopen and act.settled:
            return _outcome(act)
        if self.unwound:  # the worker let go of the run: nothing more is taken
            raise Unwind
        future: asyncio.Future[Any] = self.loop.create_future()
        self.queue.append(_Call(tool, args, live, future, digest))
        self.arrived.set()
        self._start()
        return await future

    def take_blocking(self, tool: str, args: dict[str, Any], live: Any) -> Any:
        """``take`` from a synchronous node's thread: taken on the run's loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise UsageError(f"run {self.ctx.run_id}: a synchronous model or tool call on the "
                             "event loop of the run; call it with ainvoke in an async node")
        return asyncio.run_coroutine_threadsafe(self.take(tool, args, live), self.loop).result()

    def _start(self) -> None:
        if self.issuer is None or self.issuer.done():
            self.issuer = self.loop.create_task(self._issue())

    async def _issue(self) -> None:
        """Hand what is asked for to the run, one decision at a time: the group a crash
        left open first, then the entries to record, then the calls asked for together."""
        try:
            while True:
                for _ in range(GATHER_TICKS):  # let what was started together join
                    await asyncio.sleep(0)
                if self.reopen_record or (not self.reopen and self.entries):
                    await self._record()
                elif self.reopen:
                    await self._send(await self._reopened())
                elif self.queue:  # at most as many at once as the agent allows
                    most = max(1, self.owner.max_parallel)
                    batch, self.queue = self.queue[:most], self.queue[most:]
                    await self._send(batch)
                else:
                    return
        except BaseException as exc:  # Unwind, a nondeterminism: every caller gets it
            if isinstance(exc, Unwind):
                self.unwound = True
            waiting = [c.future for c in self.queue] + [f for _, f in self.flushes]
            self.queue, self.flushes = [], []
            for future in waiting:
                if not future.done():
                    future.set_exception(exc)

    async def _reopened(self) -> list[_Call]:
        """The calls of the group the crash left open, in its order, once each was asked
        for again (the others wait meanwhile)."""
        wanted = {(a.tool, _digest_of(a)): step for step, a in self.reopen.items()}
        waited = self.loop.time() + OPEN_WAIT_S
        while True:
            found = {wanted[(c.tool, c.digest)]: c for c in self.queue
                     if (c.tool, c.digest) in wanted}
            if len(found) == len(wanted):
                break
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), waited - self.loop.time())
            except TimeoutError:
                step = min(s for s in self.reopen if s not in found)
                act = self.reopen[step]
                raise NondeterminismError(
                    self.ctx.run_id, step, f"call {act.tool}", "no such call",
                    "the step open when the run stopped was not taken again") from None
        self.reopen = {}
        batch = [found[s] for s in sorted(found)]
        self.queue = [c for c in self.queue if c not in batch]
        return batch

    async def _send(self, batch: list[_Call]) -> None:
        with ExitStack() as stack:
            for c in batch:
                stack.enter_context(self.owner.live.handing(
                    live_key(self.ctx.run_id, c.tool, c.args), c.live))
            if len(batch) == 1:
                got: list[Any] = [await _settled(self.ctx.call(batch[0].tool, batch[0].args))]
            else:
                got = await self.ctx.parallel([(c.tool, c.args) for c in batch],
                                              return_exceptions=True)
        for c, outcome in zip(batch, got, strict=True):
            if c.future.done():
                continue
            if isinstance(outcome, StepFailed):
                c.future.set_exception(outcome)
            else:
                c.future.set_result(outcome)

    async def idle(self) -> None:
        """Return once nothing is being handed to the run (before a wait)."""
        await self.flush()
        while self.issuer is not None and not self.issuer.done():
            await asyncio.wait([self.issuer])

    async def wait(self, reason: str, data: Any, timeout_s: float) -> Any:
        """A durable wait for input (``durable respond``): the response, from the log when
        it was given; the worker lets go of the run until then."""
        if self.unwound:
            raise Unwind
        try:
            return await self.ctx.wait("input", reason, timeout_s, data)
        except Unwind:
            self.unwound = True
            raise


async def _settled(call: Awaitable[Any]) -> Any:
    """A step's outcome, its ``StepFailed`` returned as ``ctx.parallel`` returns it."""
    try:
        return await call
    except StepFailed as exc:
        return exc


RUNS: Bindings[Binding] = Bindings("durable_langgraph_run")


def bound_run() -> Binding | None:
    """The durable run the current code executes, whatever its ``DurableGraph``."""
    return RUNS.var.get()
