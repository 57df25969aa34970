"""The actions (POST, CSRF-checked, role-checked): cancel (with compensation), approve or
reject, fork, reconcile now, release from quarantine, settle an unknown outcome. Each goes
through the ``Client`` under the logged-in user's name, which the run's log records:
``cancel_requested.by`` and the event's actor, ``approval_decided.approver``,
``released.by``, the settle's ``operator``, the fork's events' actor.

The library's answer (refused, not found, a bad input) comes back to the run's page as a
one-line message; nothing is written when it refuses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from durable.client import Client
from durable.errors import DurableError, Refused
from durable.log.state import RunState
from durable.security.users import User

from .auth import check_csrf, require

log = logging.getLogger("durable.console")


def approve(client: Client, user: User, run_id: str, request: str, decision: str,
            note: str = "") -> RunState:
    """Decide an approval as ``user``: the one place the console does.

    The console signs the decision with the private key the users file names for this user
    (``approver_key``, read here and never sent anywhere), and the library checks it against
    the approver registry under the user's name (``durable approvers add NAME``): the key's
    roles, not the console's, say which requests the user may decide.
    """
    if user.approver_key is None:
        raise Refused(run_id, f"{user.name} has no approver_key in the console's users file: "
                      "a decision must be signed by a registered approver key")
    try:
        pem = user.approver_key.read_bytes()
    except OSError as exc:
        raise Refused(run_id, f"{user.name}'s approver key cannot be read: "
                      f"{exc.strerror or exc}") from None
    return client.sign_and_approve(run_id, request, decision, user.name, pem, note=note)


def _signing_key(user: User, run_id: str, what: str) -> bytes:
    """The private key the users file names for ``user`` (``approver_key``): what signs
    their decisions, checked against the key registered under their name."""
    if user.approver_key is None:
        raise Refused(run_id, f"{user.name} has no approver_key in the console's users file: "
                      f"{what} must be signed by a registered key")
    try:
        return user.approver_key.read_bytes()
    except OSError as exc:
        raise Refused(run_id, f"{user.name}'s key cannot be read: "
                      f"{exc.strerror or exc}") from None


Act = Callable[[Client, User, str, dict[str, Any]], str]


def _action(role: str, act: Act) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        form = await check_csrf(request)
        user = require(request, role)
        run_id = request.path_params["run_id"]
        client: Client = request.app.state.client
        back = str(form.get("back") or "")
        if not back.startswith("/") or back.startswith("//"):  # this site's pages only
            back = f"/runs/{run_id}"
        try:
            message = await run_in_threadpool(act, client, user, run_id, form)
        except DurableError as exc:
            message = f"refused: {exc}"
        log.info("%s: %s %s: %s", user.name, request.url.path.rsplit("/", 1)[-1], run_id,
                 message)
        request.session["flash"] = message
        return RedirectResponse(back, 303)

    return endpoint


def _text(form: dict[str, Any], name: str, default: str = "") -> str:
    value = form.get(name, default)
    return value.strip() if isinstance(value, str) else default


def _cancel(c: Client, user: User, run_id: str, form: dict[str, Any]) -> str:
    scope = _text(form, "scope", "run")
    reason = _text(form, "reason") or f"canceled by {user.name} in the console"
    if _text(form, "compensate") == "1":  # the whole run, its applied effects undone first
        done = c.abort(run_id, reason, by=user.name)
        kept = "".join(f"; could not be undone: step {s} ({why})"
                       for s, why in done.not_undone.items())
        return f"cancel with compensation requested by {user.name}: compensating steps " \
               f"{', '.join(map(str, done.compensating)) or 'none'}{kept}"
    state = c.cancel(run_id, reason, scope=scope, by=user.name)
    return f"cancel ({scope}) requested by {user.name}: run is {state.state}"


def _approve(c: Client, user: User, run_id: str, form: dict[str, Any]) -> str:
    decision = _text(form, "decision")
    request = _text(form, "request")
    state = approve(c, user, run_id, request, decision, _text(form, "note"))
    return f"{decision} of {request} recorded for {user.name}: run is {state.state}"


def _settle(c: Client, user: User, run_id: str, form: dict[str, Any]) -> str:
    """Settle a step's unknown outcome as ``user``, signed with their key: the registry
    says whether that key holds the settle role (``DURABLE_SETTLE_ROLE``)."""
    resolution = _text(form, "resolution")
    try:
        step = int(_text(form, "step"))
        text = _text(form, "result")
        result = json.loads(text) if text and resolution == "applied" else None
    except ValueError:
        return "refused: the step must be a number and the result JSON"
    pem = _signing_key(user, run_id, "a settle")
    state = c.sign_and_settle(run_id, step, resolution, user.name, pem,
                              evidence=_text(form, "evidence"), result=result)
    return f"step {step} settled {resolution} by {user.name}: run is {state.state}"


def _fork(c: Client, user: User, run_id: str, form: dict[str, Any]) -> str:
    at = _text(form, "at")
    if not at:
        return "refused: choose an entry to fork at"
    new_id = _text(form, "new_run_id") or None
    state = c.fork(run_id, at, new_id, by=user.name)
    return f"forked at {at} as {state.run_id} ({state.state})"


def _reconcile(c: Client, user: User, run_id: str, form: dict[str, Any]) -> str:
    c.reconcile_soon(run_id)
    return "due now: the reconciler's next sweep looks at it"


def _release(c: Client, user: User, run_id: str, form: dict[str, Any]) -> str:
    return f"released by {user.name}: run is {c.release(run_id, by=user.name)}"


cancel = _action("operator", _cancel)
decide = _action("approver", _approve)
fork = _action("operator", _fork)
reconcile = _action("operator", _reconcile)
release = _action("operator", _release)
settle = _action("operator", _settle)
