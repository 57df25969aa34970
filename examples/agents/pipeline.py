"""The ``pipeline`` agent: fetch data -> transform -> write to the database -> notify.

This is the template to copy. Everything durable about it comes from four habits:

1. ``decide(state)`` is a pure function of the folded state: no clock, no I/O, no
   randomness. It reads ``state.step``, ``state.input`` and earlier results from
   ``state.actions[step].result``, so a recovered run decides exactly what the log says.
2. Every effect carries ``ctx.key`` (stable across retries and workers) and
   ``ctx.deadline_ms`` downstream: as the ``Idempotency-Key`` and ``X-Deadline-Ms``
   headers of the API, as a unique column of the database. Work that arrives past its
   deadline is refused, so "not applied" after the deadline is proof.
3. Every tool has ``lookup(key, args)``, which asks the authoritative system (not a cache,
   not the worker's memory) whether the effect with that key happened.
4. Retryable errors are named (``retryable = (WorldUnavailable, DeadlinePassed)``), and
   raising one is a promise that the effect was not applied. Anything else fails the step.

Where things are: the world's URL is ``DURABLE_WORLD_URL`` (``examples.settings.world_url()``,
default ``http://127.0.0.1:8765``); the database's path is asked from the world
(``GET /info``). Try it::

    python -m examples world &      # the data source, the notification API and the database
    durable worker &
    durable start pipeline --input '{"source": "orders", "recipient": "ops@example.com"}'
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, Field

from durable.agents import Agent, Call, Decision, Fail, Finish, Lookup, Tool, ToolContext, register
from durable.agents.cancel_token import Cancelled, CancelToken
from durable.log.state import RunState
from examples.settings import world_url
from examples.world.protocol import DEADLINE_HEADER, KEY_HEADER


class WorldUnavailable(Exception):
    """503, or the request never reached the world: not applied. Retryable."""


class DeadlinePassed(Exception):
    """The world refused the call: it arrived past its deadline. Not applied. Retryable."""


class Refused(Exception):
    """The world refused the call for good (unknown source, aborted key). Not retryable."""


# Plumbing: where the world is, and one HTTP client per worker process ---------------------

_http = httpx.Client()
logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per request


def world() -> str:
    return world_url()


@lru_cache(maxsize=8)
def _db_path(world_url: str) -> str:
    return str(_http.get(f"{world_url}/info", timeout=5).raise_for_status().json()["db"])


def db_path() -> str:
    return _db_path(world())


def headers(ctx: ToolContext) -> dict[str, str]:
    """The key and the deadline go downstream with every effect."""
    return {KEY_HEADER: ctx.key, DEADLINE_HEADER: str(ctx.deadline_ms)}


def check_refusals(resp: httpx.Response) -> None:
    """Map the world's "not applied" answers to named errors."""
    if resp.status_code == 503:
        raise WorldUnavailable(f"{resp.request.url.path}: 503")
    if resp.status_code == 408:
        raise DeadlinePassed(f"{resp.request.url.path}: refused past the deadline")
    if resp.status_code in (404, 409):
        raise Refused(f"{resp.request.url.path}: {resp.json().get('error')}")
    resp.raise_for_status()


class InFlight:
    """A request on its own thread, so that the tool can watch its cancel token meanwhile."""

    def __init__(self, request: Callable[[], httpx.Response]) -> None:
        self.done = threading.Event()
        self.outcome: list[httpx.Response | BaseException] = []
        threading.Thread(target=self._run, args=(request,), daemon=True).start()

    def _run(self, request: Callable[[], httpx.Response]) -> None:
        try:
            self.outcome.append(request())
        except BaseException as exc:
            self.outcome.append(exc)
        self.done.set()

    def wait(self, token: CancelToken | None) -> bool:
        """Wait for the reply (True); with a token, stop early when it fires (False)."""
        while not self.done.wait(0.05):
            if token is not None and token.cancelled:
                return False
        return True

    def response(self) -> httpx.Response:
        result = self.outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result


NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


# Tools -------------------------------------------------------------------------------


@register
class Fetch(Tool):
    """Read a source's records. A read changes nothing, so stopping or repeating it is safe."""

    name = "fetch"
    timeout_s = 2.0
    cancellable = True
    retryable = (WorldUnavailable, DeadlinePassed)

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        ctx.check()
        call = InFlight(lambda: _http.get(f"{world()}/source/{quote(args['source'], safe='')}",
                                          headers=headers(ctx), timeout=ctx.remaining() + 1))
        if not call.wait(ctx.token):
            raise Cancelled(ctx.token.reason)  # honest for a read: there is nothing to undo
        try:
            resp = call.response()
        except httpx.TransportError as exc:  # lost reply of a read: just read again
            raise WorldUnavailable(f"fetch: {exc!r}") from exc
        check_refusals(resp)
        return {"source": args["source"], "records": resp.json()["records"]}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()  # no effect to find: after an unknown outcome, read again


@register
class Transform(Tool):
    """Pure computation: no external effect, so ``lookup`` says "not applied" (redo it)."""

    name = "transform"
    timeout_s = 2.0
    cancellable = True

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        ctx.check()
        records, threshold = args["records"], float(args["threshold"])
        by_region: dict[str, float] = {}
        for rec in records:
            by_region[rec["region"]] = round(by_region.get(rec["region"], 0) + rec["amount"], 2)
        return {"count": len(records), "total": round(sum(r["amount"] for r in records), 2),
                "flagged": [r["id"] for r in records if r["amount"] >= threshold],
                "by_region": by_region}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


class ReportSummary(BaseModel):
    count: int
    total: float


class WriteArgs(BaseModel):
    """Record a report in the operations database."""

    source: str = Field(description="what the report is about")
    summary: ReportSummary = Field(description="the report's content")


@register
class Write(Tool):
    """Insert the report, keyed by ``ctx.key`` (a unique column), refusing late work."""

    name = "write"
    args_model = WriteArgs  # what a model is told of it (durable.tool_schemas)
    timeout_s = 2.0
    cancellable = True  # it only raises Cancelled before anything is written
    retryable = (WorldUnavailable, DeadlinePassed)

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        ctx.check()
        conn = sqlite3.connect(db_path(), timeout=max(0.1, ctx.remaining() - 0.5),
                               isolation_level=None)
        try:
            try:
                conn.execute("BEGIN IMMEDIATE")  # the write lock first, then the checks
            except sqlite3.OperationalError as exc:  # locked: nothing was written
                raise WorldUnavailable(f"database busy: {exc}") from exc
            try:
                ctx.check()
                if time.time() * 1000 > ctx.deadline_ms:
                    raise DeadlinePassed("write refused past the deadline")
                summary = args["summary"]
                cur = conn.execute(
                    "INSERT INTO reports (idem_key, run_id, source, count, total, body, "
                    "written_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (ctx.key, ctx.run_id, args["source"], summary["count"], summary["total"],
                     json.dumps(summary), int(time.time() * 1000)))
                conn.execute("COMMIT")
            except sqlite3.IntegrityError:  # the unique key: this report was written before
                conn.execute("ROLLBACK")
                return self.lookup(ctx.key, args).result
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return {"report_id": cur.lastrowid}
        finally:
            conn.close()

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        conn = sqlite3.connect(db_path(), timeout=5)
        try:
            row = conn.execute("SELECT id FROM reports WHERE idem_key = ? ORDER BY id LIMIT 1",
                               (key,)).fetchone()
        finally:
            conn.close()
        return Lookup.applied({"report_id": row[0]}) if row else Lookup.not_applied()


class NotifyArgs(BaseModel):
    """Send a notification to a recipient (once per call)."""

    recipient: str = Field(description="an e-mail address")
    message: str


@register
class Notify(Tool):
    """Send a notification through the API, which deduplicates by ``Idempotency-Key``."""

    name = "notify"
    args_model = NotifyArgs
    timeout_s = 2.0
    cancellable = True  # Cancelled only when nothing was sent, or the API confirms it never will
    retryable = (WorldUnavailable, DeadlinePassed)

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        ctx.check()  # canceled before sending: nothing to undo
        body = {"recipient": args["recipient"], "message": args["message"]}
        call = InFlight(lambda: _http.post(f"{world()}/notify", json=body, headers=headers(ctx),
                                           timeout=ctx.remaining() + 1))
        if not call.wait(ctx.token):
            # Canceled while the request is out. Ask the API to refuse this attempt: if it
            # was not applied yet, it never will be, and Cancelled is the truth.
            verdict = self._abort(ctx)
            if verdict is not None and not verdict["applied"]:
                raise Cancelled(ctx.token.reason)
            if verdict is not None:
                return verdict["result"]  # it happened before the cancel got there
            call.wait(None)  # the API cannot say: no promise; the worker will interrupt us
        try:
            resp = call.response()
        except NOT_SENT as exc:
            raise WorldUnavailable(f"notify: {exc!r}") from exc
        except httpx.TransportError:
            return self._reply_lost(ctx)
        check_refusals(resp)
        return resp.json()["result"]

    def _reply_lost(self, ctx: ToolContext) -> Any:
        """Sent, but the reply was lost: "applied" is proof at any time; "not applied" is
        proof only after the deadline. So wait it out: the worker records a timeout (outcome
        unknown) and calls ``lookup`` once the deadline has passed."""
        found = self.lookup(ctx.key, {})
        if found.status == "applied":
            return found.result
        while ctx.remaining() > 0:
            time.sleep(0.05)
        time.sleep(0.25)  # a clock-skew margin; a worker never gets here (it gave up)
        found = self.lookup(ctx.key, {})
        if found.status == "applied":
            return found.result
        raise WorldUnavailable("notify: reply lost, and not applied by the deadline")

    def _abort(self, ctx: ToolContext) -> dict[str, Any] | None:
        try:
            resp = _http.post(f"{world()}/notify/{quote(ctx.key, safe='')}/abort",
                              headers=headers(ctx), timeout=0.5)
            return dict(resp.raise_for_status().json())
        except httpx.HTTPError:
            return None

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        resp = _http.get(f"{world()}/notify/{quote(key, safe='')}", timeout=5)
        found = resp.raise_for_status().json()
        return Lookup.applied(found["result"]) if found["applied"] else Lookup.not_applied()


# The agent ---------------------------------------------------------------------------


class PipelineInput(BaseModel):
    source: str = Field(default="orders", pattern=r"^[a-z0-9-]{1,40}$",
                        description="the data source to fetch (orders, invoices, ...)")
    recipient: str = Field(default="ops@example.com", min_length=3, max_length=200)
    threshold: float = Field(default=250.0, ge=0, description="flag records at or above it")


@register
class Pipeline(Agent):
    name = "pipeline"
    version = "1"
    input_model = PipelineInput
    tools = ("fetch", "transform", "write", "notify")

    def decide(self, state: RunState) -> Decision:
        inp = state.input
        last = state.last
        if last is not None and last.status != "succeeded":
            return Fail(f"step {last.step} ({last.tool}) {last.status}: {last.error or ''}")
        results = {step: act.result for step, act in state.actions.items()}
        if state.step == 0:
            return Call("fetch", {"source": inp["source"]})
        if state.step == 1:
            return Call("transform", {"records": results[1]["records"],
                                      "threshold": inp["threshold"]})
        if state.step == 2:
            return Call("write", {"source": inp["source"], "summary": results[2]})
        summary = results[2]
        if state.step == 3:
            message = (f"{inp['source']}: {summary['count']} records, total "
                       f"{summary['total']}, {len(summary['flagged'])} flagged; "
                       f"report #{results[3]['report_id']}")
            return Call("notify", {"recipient": inp["recipient"], "message": message})
        return Finish({"source": inp["source"], "total": summary["total"],
                       "report_id": results[3]["report_id"],
                       "notification_id": results[4]["notification_id"]})
