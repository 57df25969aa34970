"""Agents and tools used only by the tests (registered when this module is imported;
worker processes import it through ``DURABLE_AGENTS``)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from pydantic import BaseModel

from durable.agents import Agent, Call, Decision, Finish, Lookup, Tool, ToolContext, register
from durable.log.state import RunState
from tests.servers.effects import applications as applications  # the tests import it here
from tests.servers.effects import effects_db as _db
from tests.servers.effects import model_requests as model_requests


class EchoInput(BaseModel):
    text: str = ""
    steps: int = 1


class Flaky(Exception):
    """A retryable error, named explicitly by the tool."""


@register
class Stubborn(Tool):
    """Ignores its cancel token: the worker must interrupt it."""

    name = "stubborn"
    timeout_s = 30.0
    cancellable = False

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        import time

        end = time.time() + float(args.get("sleep_s", 20))
        while time.time() < end:
            try:
                time.sleep(0.01)
            except Exception:
                pass
        return "done"

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@register
class Blocker(Tool):
    """Blocks in C (one long ``time.sleep``) past its deadline on the first attempt of step
    1, where no interrupt can land: the worker must give the run up."""

    name = "blocker"
    timeout_s = 1.0

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        import time

        if args.get("n") == 1 and ctx.attempt <= 1:
            time.sleep(float(args.get("sleep_s", 4)))
        return {"n": args.get("n"), "attempt": ctx.attempt}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@register
class Echo(Agent):
    name = "echo"
    input_model = EchoInput
    tools = ("noop", "stubborn", "blocker")

    def decide(self, state: RunState) -> Decision:
        if state.step >= state.input["steps"]:
            return Finish(state.input["text"])
        tool = os.environ.get("ECHO_TOOL", "noop")
        return Call(tool, {"n": state.step + 1, "sleep_s": float(os.environ.get("ECHO_SLEEP", 0))})


class WriterInput(BaseModel):
    steps: int = 3


@register
class SqlWrite(Tool):
    """Writes one row keyed by the idempotency key into a real SQLite database.

    The database refuses work past the deadline. With ``TEST_DB_DEDUPE=0`` the key column
    has no unique constraint: only the system's ledger and lookups prevent duplicates.
    ``TEST_SLOW_S`` makes the call sleep before writing (a window to pause or kill in).
    """

    name = "sqlwrite"
    timeout_s = 2.0
    cancellable = False

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        import sqlite3
        import time

        time.sleep(float(os.environ.get("TEST_SLOW_S", "0")))
        conn = _db()
        try:
            # The deadline is checked under the database's write lock, which a lookup takes
            # too: a write is either visible to a lookup or refused, never applied after a
            # lookup has answered "not applied" (waiting for the lock can cross the deadline).
            conn.execute("BEGIN IMMEDIATE")
            if time.time() * 1000 > ctx.deadline_ms:
                raise TimeoutError("refused: past the deadline")
            conn.execute("INSERT INTO effects VALUES (?, ?)", (ctx.key, time.time()))
            conn.execute("COMMIT")
        except sqlite3.IntegrityError:
            pass  # deduplicated by the unique key
        finally:
            conn.close()  # an open transaction is rolled back
        return {"row": ctx.key}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        conn = _db()
        try:
            conn.execute("BEGIN IMMEDIATE")
            n = conn.execute("SELECT COUNT(*) FROM effects WHERE key = ?", (key,)).fetchone()[0]
        finally:
            conn.close()
        return Lookup.applied({"row": key}) if n else Lookup.not_applied()


@register
class Writer(Agent):
    name = "writer"
    input_model = WriterInput
    tools = ("sqlwrite",)

    def decide(self, state: RunState) -> Decision:
        if state.step >= state.input["steps"]:
            return Finish({"rows": state.step})
        return Call("sqlwrite", {"n": state.step + 1})


@register
class Asker(Agent):
    """Asks for input first (a wait), then echoes it."""

    name = "asker"
    input_model = EchoInput
    tools = ("noop",)

    def decide(self, state: RunState) -> Decision:
        from durable.agents import Wait

        if state.last_wait is None:
            return Wait("input", reason="what should I say?", timeout_s=float(
                os.environ.get("ASKER_TIMEOUT_S", "3600")))
        return Finish(state.input["text"])


class PayInput(BaseModel):
    amount: int = 10


@register
class Payout(Tool):
    """A payment that needs an approver with the role ``finance``. The approval is bound to
    the amount and to the account's balance read from ``TEST_FACT_FILE`` (a fact)."""

    name = "payout"
    timeout_s = 2.0
    requires_approval = True
    approver_role = "finance"
    approval_ttl_s = 60.0

    def approval_facts(self, args: dict[str, Any]) -> dict[str, Any]:
        from pathlib import Path

        path = os.environ.get("TEST_FACT_FILE")
        return {"balance": Path(path).read_text().strip() if path else "?"}

    def evidence(self, args: dict[str, Any]) -> list[str]:
        return [f"invoice:{args['amount']}"]

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return SqlWrite().run(args, ctx)

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return SqlWrite().lookup(key, args)


@register
class Payer(Agent):
    name = "payer"
    version = os.environ.get("PAYER_VERSION", "1")
    on_version_change = "reapprove"
    input_model = PayInput
    tools = ("payout",)

    def decide(self, state: RunState) -> Decision:
        if state.step == 0:
            return Call("payout", {"amount": state.input["amount"]})
        last = state.last
        assert last is not None
        return Finish({"paid": last.status == "succeeded", "status": last.status})


@register
class Quoter(Agent):
    """Waits for input; on resume the quote must still be valid (``TEST_QUOTE_VALID``)."""

    name = "quoter"
    input_model = EchoInput
    tools = ("noop",)

    def decide(self, state: RunState) -> Decision:
        from durable.agents import Wait

        if state.refresh:
            return Finish({"refreshed": state.refresh})
        if state.last_wait is None:
            return Wait("input", reason="confirm the quote", timeout_s=60)
        return Finish({"answer": state.last_wait.response})

    def revalidate(self, state: RunState) -> Any:
        from durable.agents import Stale

        then = os.environ.get("TEST_QUOTE_STALE")
        return Stale("the quote expired while waiting", then) if then else None  # type: ignore[arg-type]


@register
class LostReply(Tool):
    """Writes its row, then reports that the reply was lost (``OutcomeUnknown``); its
    lookup fails while ``TEST_LOOKUP_DOWN`` names an existing file, and hangs while
    ``TEST_LOOKUP_HANG`` does."""

    name = "lostreply"
    timeout_s = 0.5

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        from durable.agents import OutcomeUnknown

        SqlWrite().run(args, ctx)
        raise OutcomeUnknown("connection reset after the request was sent")

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        down = os.environ.get("TEST_LOOKUP_DOWN")
        if down and os.path.exists(down):
            raise ConnectionError("authoritative system unreachable")
        hang = os.environ.get("TEST_LOOKUP_HANG")
        while hang and os.path.exists(hang):  # an authoritative system that never answers
            time.sleep(0.05)
        return SqlWrite().lookup(key, args)


@register
class Unsure(Agent):
    name = "unsure"
    input_model = WriterInput
    tools = ("lostreply",)

    def decide(self, state: RunState) -> Decision:
        if state.step >= state.input["steps"]:
            return Finish({"rows": state.step})
        return Call("lostreply", {"n": state.step + 1})


@register
class FlakyTool(Tool):
    """Fails with ``Flaky`` (retryable) for the first ``TEST_FLAKY_N`` calls, counted in a
    file; ``boom`` raises a ValueError, which is not retryable."""

    name = "flaky"
    timeout_s = 2.0
    retryable = (Flaky,)
    max_quick_retries = 2
    retry_backoff_s = 0.2

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        if args.get("boom"):
            raise ValueError("bad request: not retryable")
        from pathlib import Path

        path = Path(os.environ["TEST_FLAKY_FILE"])
        calls = int(path.read_text() or 0) + 1 if path.exists() else 1
        path.write_text(str(calls))
        if calls <= int(os.environ.get("TEST_FLAKY_N", "0")):
            raise Flaky(f"503 on call {calls}")
        return {"calls": calls}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


class FlakyInput(BaseModel):
    boom: bool = False


@register
class Persistent(Agent):
    name = "persistent"
    input_model = FlakyInput
    tools = ("flaky",)

    def decide(self, state: RunState) -> Decision:
        from durable.agents import Fail

        last = state.last
        if last is None:
            return Call("flaky", {"boom": state.input["boom"]})
        if last.status == "failed":
            return Fail(f"gave up: {last.error_type}: {last.error}")
        return Finish(last.result)


class HangInput(BaseModel):
    hang: bool = False


@register
class Hang(Agent):
    """``decide`` never returns when ``hang`` is set (a bug in agent code, a blocking call
    without a timeout): the worker must quarantine the run and go on with the others."""

    name = "hang"
    input_model = HangInput
    tools = ("noop",)

    def decide(self, state: RunState) -> Decision:
        import time

        while state.input["hang"]:
            time.sleep(0.05)
        if state.step >= 1:
            return Finish("done")
        return Call("noop", {"n": 1})


@register
class AsyncSleep(Tool):
    """An ``async def`` tool: awaits on its own thread's event loop; a cancel cancels it."""

    name = "asyncsleep"
    timeout_s = 30.0
    cancellable = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        import asyncio

        await asyncio.sleep(float(args.get("sleep_s", 0)))
        return {"slept": args.get("sleep_s", 0), "key": ctx.key}

    async def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


class AsyncerInput(BaseModel):
    steps: int = 2
    sleep_s: float = 0.0


@register
class Asyncer(Agent):
    name = "asyncer"
    input_model = AsyncerInput
    tools = ("asyncsleep",)

    def decide(self, state: RunState) -> Decision:
        if state.step >= state.input["steps"]:
            return Finish([a.result for a in state.actions.values()])
        return Call("asyncsleep", {"sleep_s": state.input["sleep_s"]})


# Code agents (ordinary functions) register on import too.
import tests.agents.async_code  # noqa: E402
import tests.agents.children  # noqa: E402
import tests.agents.code  # noqa: E402
import tests.agents.parallel  # noqa: E402, F401

#: Opened by an in-process test: the ``gate`` tool blocks until then (a slow API call).
GATE = threading.Event()


@register
class Gate(Tool):
    """Blocks until ``GATE`` opens, or its deadline (in-process tests only)."""

    name = "gate"
    timeout_s = 30.0

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        GATE.wait(ctx.remaining())
        return {"opened": GATE.is_set()}


@register
class Gated(Agent):
    """One call of ``gate``, then done."""

    name = "gated"
    input_model = HangInput  # no input of its own
    tools = ("gate",)

    def decide(self, state: RunState) -> Decision:
        if state.step >= 1:
            return Finish(state.actions[1].result)
        return Call("gate", {})


@register
class NoteThenAsk(Agent):
    """One no-op step, then a wait for input, then finish with the step's result: a run
    that rests between its steps, held by no worker."""

    name = "note-then-ask"
    input_model = EchoInput
    tools = ("noop",)

    def decide(self, state: RunState) -> Decision:
        from durable.agents import Wait

        if state.step == 0:
            return Call("noop", {"n": 1})
        if state.last_wait is None:
            return Wait("input", reason="go on?")
        return Finish(state.actions[1].result)
