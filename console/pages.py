"""The pages (GET): runs, one run, approvals, workers, and the fragments the live parts
reload. Every read goes through the ``Client``, on Starlette's thread pool (the client is
synchronous)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from durable.agents.configuration import describe
from durable.audit.diff import diff
from durable.audit.replay import summary
from durable.cli.runs import config_drift, drift_policy
from durable.client import Client, RunSummary
from durable.errors import DecodeError, RunNotFound, UsageError
from durable.flow import budgets
from durable.flow.limit_usage import usage
from durable.log.state import ALL_STATES, WAITING, Approval, RunState
from durable.log.store import now_ms
from durable.security.sealing import shown

from . import status
from .auth import csrf_token, current
from .timeline import masked, timeline

PAGE = 25
#: The age filter's choices: seconds -> label.
AGES = {"": "any age", "300": "5 min", "3600": "1 hour", "86400": "1 day", "604800": "7 days"}


#: Fragments a page's live refresh loads into it: they never show (so never take) the
#: flash message, which an action leaves for the page its redirect loads. A refresh of
#: the page the action was sent from, racing that redirect, had taken it.
FRAGMENTS = frozenset({"runs_table.html", "run_panel.html", "state.html"})


def render(request: Request, name: str, context: dict[str, Any],
           status_code: int = 200) -> Response:
    user = request.app.state.access.user(request)
    flash = None if name in FRAGMENTS else request.session.pop("flash", None)
    base = {"user": user, "csrf": csrf_token(request), "dev": request.app.state.dev,
            "flash": flash}
    response: Response = request.app.state.templates.TemplateResponse(
        request, name, {**base, **context}, status_code=status_code)
    return response


def client(request: Request) -> Client:
    c: Client = request.app.state.client
    return c


# Runs -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Filters:
    state: str = ""
    agent: str = ""
    age: str = ""
    q: str = ""
    after: str = ""
    tenant: str = ""
    #: "1": only the runs with no valid next event (``Client.orphaned``).
    orphaned: str = ""

    @classmethod
    def of(cls, request: Request) -> Filters:
        p = request.query_params
        f = cls(p.get("state", ""), p.get("agent", "").strip(), p.get("age", ""),
                p.get("q", "").strip(), p.get("after", ""), p.get("tenant", "").strip(),
                p.get("orphaned", ""))
        if f.orphaned not in ("", "1"):
            raise HTTPException(400, f"orphaned is 1 or absent, not {f.orphaned!r}")
        if f.state and f.state not in ALL_STATES:
            raise HTTPException(400, f"unknown state {f.state!r}")
        if f.age not in AGES:
            raise HTTPException(400, f"unknown age {f.age!r}")
        return f

    def query(self, **changes: str) -> str:
        data = {**self.__dict__, **changes}
        return urlencode({k: v for k, v in data.items() if v})


def list_runs(c: Client, f: Filters) -> list[RunSummary]:
    if f.orphaned:
        return orphaned_runs(c, f)
    if f.q:
        found = c.search(f.q, limit=PAGE)
        return [r for r in found if (not f.state or r.state == f.state)
                and (not f.agent or r.agent == f.agent)
                and (not f.tenant or r.tenant == f.tenant)]
    since = now_ms() - int(f.age) * 1000 if f.age else None
    try:
        return c.runs(f.state or None, PAGE, agent=f.agent or None, after=f.after or None,
                      since=since, tenant=f.tenant or None)
    except RunNotFound:
        return c.runs(f.state or None, PAGE, agent=f.agent or None, since=since,
                      tenant=f.tenant or None)


def orphaned_runs(c: Client, f: Filters) -> list[RunSummary]:
    """The orphaned runs that match the other filters (the first ``PAGE``), each with why
    in its reason column."""
    since = now_ms() - int(f.age) * 1000 if f.age else 0
    out = []
    for o in c.orphaned():
        if (f.state and o.state != f.state) or (f.agent and o.agent != f.agent) or \
                (f.q and f.q not in o.run_id) or o.updated < since:
            continue
        p = c.log.projection(o.run_id)
        if f.tenant and p.get("tenant") != f.tenant:
            continue
        out.append(RunSummary(o.run_id, o.state, o.agent, int(p.get("step", 0)),
                              int(p.get("version", 0)), o.updated, o.why,
                              p.get("tenant", ""), p.get("owner", "")))
        if len(out) == PAGE:
            break
    return out


@dataclass(frozen=True)
class Waiting:
    run: RunSummary
    kind: str
    reason: str
    request: str
    until: int


def waiting_runs(c: Client, limit: int = 20) -> list[Waiting]:
    """Waiting runs, oldest wait first, with what each waits for and until when."""
    found: list[RunSummary] = []
    for state in sorted(WAITING):
        found += c.runs(state, limit, oldest_first=True)
    out = []
    for run in sorted(found, key=lambda r: r.updated)[:limit]:
        try:
            wait = c.status(run.run_id).wait
        except (RunNotFound, DecodeError):
            continue
        out.append(Waiting(run, wait.kind if wait else "?", wait.reason if wait else "",
                           wait.request if wait else "", wait.deadline if wait else 0))
    return out


async def runs_page(request: Request) -> Response:
    return await _runs(request, "runs.html", ages=AGES)


def runs_reads(c: Client, f: Filters) -> tuple[list[RunSummary], dict[str, int], list[Waiting],
                                               dict[str, status.Holder]]:
    """The listed runs, the counts, the waiting runs, and who holds each listed run."""
    try:
        runs = list_runs(c, f)
    except UsageError as exc:
        raise HTTPException(400, str(exc)) from None
    return runs, c.counts(), waiting_runs(c), status.holders(c, runs)


async def runs_table(request: Request) -> Response:
    """The runs list alone (the live refresh of the runs page)."""
    return await _runs(request, "runs_table.html")


async def _runs(request: Request, template: str, **more: Any) -> Response:
    current(request)
    f = Filters.of(request)
    runs, counts, waiting, held = await run_in_threadpool(runs_reads, client(request), f)
    return render(request, template, {"f": f, "runs": runs, "counts": counts,
                                       "waiting": waiting, "held": held, "page": PAGE,
                                       "now": now_ms(), **more})


# One run -------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpenApproval:
    run_id: str
    approval: Approval
    tool: str
    args: Any


def open_approvals(state: RunState) -> list[OpenApproval]:
    out = []
    for appr in state.approvals.values():
        if appr.decision is not None:
            continue
        act = state.actions.get(appr.step)
        out.append(OpenApproval(state.run_id, appr, act.tool if act else "?",
                                masked(act.args) if act else None))
    return out


def applicable(state: RunState) -> list[str]:
    """The run page's actions that apply to the run now, whoever asks (the page offers
    each only to the roles that may take it): cancel and reconcile while it is not over,
    release when quarantined, settle for each unknown outcome of a run that goes on, fork
    always."""
    out = ["cancel", "reconcile"] if not state.terminal else []
    if state.state == "quarantined":
        out.append("release")
    if unsettled(state):
        out.append("settle")
    return [*out, "fork"]


def unsettled(state: RunState) -> list[Any]:
    """The steps an operator may settle (their outcome is unknown; the run is neither over
    nor quarantined)."""
    if state.terminal or state.state == "quarantined":
        return []
    return [a for a in state.actions.values() if a.status == "unknown"]


def run_reads(c: Client, run_id: str) -> dict[str, Any]:
    try:
        projection = c.projection(run_id)
        entries = c.events(run_id)
    except RunNotFound:
        raise HTTPException(404, f"run {run_id} not found") from None
    state = c.status(run_id)
    lease = c.lease(run_id)
    holder = status.holder(lease, entries)
    drift = config_drift(c, state)  # against the agents this console has (DURABLE_AGENTS)
    shown = f"{describe(drift)} (on resume: {drift_policy(c, state.agent, drift)})" \
        if drift else ""
    return {"run_id": run_id, "projection": projection, "state": state, "drift": shown,
            "summary": summary(state), "lease": lease, "holder": holder,
            "status": status.display_status(state.state, holder),
            "actions": applicable(state), "unsettled": unsettled(state),
            "tl": timeline(entries, c.ledger(run_id)),
            "approvals": open_approvals(state), "now": now_ms(),
            "cost": budgets.spent(state.cost_usd, state.uncosted)
            if state.cost_usd or state.uncosted else ""}


async def run_page(request: Request) -> Response:
    current(request)
    data = await run_in_threadpool(run_reads, client(request), request.path_params["run_id"])
    return render(request, "run.html", data)


async def run_panel(request: Request) -> Response:
    """The run's status, steps and timeline alone (the live refresh of the run page)."""
    current(request)
    data = await run_in_threadpool(run_reads, client(request), request.path_params["run_id"])
    return render(request, "run_panel.html", data)


async def state_at(request: Request) -> Response:
    """The folded state at one entry (the slider), as ``durable replay --to``."""
    current(request)
    run_id = request.path_params["run_id"]
    at = request.query_params.get("at", "+")
    try:
        state, ckpt = await run_in_threadpool(client(request).state_at, run_id, at)
    except RunNotFound:
        raise HTTPException(404, f"run {run_id} not found") from None
    except UsageError as exc:
        raise HTTPException(400, str(exc)) from None
    shown = msgspec.json.format(msgspec.json.encode(masked(msgspec.to_builtins(state))),
                                indent=2).decode()
    return render(request, "state.html", {"at": at, "ckpt": ckpt, "summary": summary(state),
                                          "state_json": shown})


# Approvals and workers -----------------------------------------------------------------

def _approvals(c: Client) -> list[OpenApproval]:
    out = []
    for run in c.runs("waiting_approval", 200):
        try:
            out += open_approvals(c.status(run.run_id))
        except (RunNotFound, DecodeError):
            continue
    return out


async def approvals_page(request: Request) -> Response:
    current(request)
    found = await run_in_threadpool(_approvals, client(request))
    return render(request, "approvals.html", {"approvals": found, "now": now_ms()})


def workers_reads(c: Client) -> dict[str, Any]:
    return {"workers": status.workers(c), "depth": c.queue_depth(), "sweeps": c.sweeps(),
            "counts": c.counts(), "now": now_ms(), "lease_ttl_ms": c.settings.leases.ttl_ms,
            "limits": usage(c.redis)}


async def workers_page(request: Request) -> Response:
    current(request)
    data = await run_in_threadpool(workers_reads, client(request))
    return render(request, "workers.html", data)


async def home(request: Request) -> Response:
    return RedirectResponse("/runs", 303)


# Two runs side by side ----------------------------------------------------------------

def diff_reads(request: Request) -> dict[str, Any]:
    """``durable diff``'s comparison of the two runs the path names, values masked."""
    c = client(request)
    a, b = request.path_params["run_id"], request.path_params["other"]
    for run in (a, b):
        try:
            c.projection(run)
        except RunNotFound:
            raise HTTPException(404, f"run {run} not found") from None
    found = diff(c.log, a, b)

    def side(value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        return {**value, "result": masked(shown(value["result"], c.log.keyring))}

    return {"a": a, "b": b, "states": [found.a.state, found.b.state],
            "first_divergence": found.first,
            "totals": {a: found.a.totals(), b: found.b.totals()},
            "steps": [{**row, "a": side(row["a"]), "b": side(row["b"])}
                      for row in found.rows]}


def _short(value: Any, limit: int = 90) -> str:
    """A value as clipped JSON, for a table cell."""
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def diff_page(request: Request) -> Response:
    current(request)
    data = await run_in_threadpool(diff_reads, request)
    return render(request, "diff.html", {**data, "short": _short})
