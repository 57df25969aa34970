"""Approver identity: Ed25519-signed decisions, checked against a registry of approver keys.

An approval decision is valid only with a signature made by a key an admin registered
(``durable approvers add NAME --role R --public-key FILE --admin-key ADMIN.key``). The
signature covers what the decision is about, so it cannot be moved to another run, request,
action or decision::

    b"durable-approval-v1\\n" + canonical JSON of
    {"decision", "digest", "expires_at", "request", "run"}     (sorted keys, no spaces)

``expires_at`` is the request's own expiry (ms since the epoch, as its
``approval_requested`` event records it; 0 = none). Who signs where: the CLI signs locally
with the approver's private key file (``durable approve ... --approver NAME --key FILE``);
a console signs server-side with the key file configured for its logged-in approver
(``sign_decision``). The client checks a decision before it writes it (``check_decision``),
the worker checks it again right before it sends the approved call, and ``durable verify``
re-checks every recorded one (``check_recorded``). The caller's environment grants nothing.

The registry (``durable.controls.approvers``) holds each approver's public key and roles, every
entry signed by an admin key the processes are configured with: a decision counts only when
its approver's entry is trusted, active, and holds the request's role.
"""

from __future__ import annotations

from durable import clock
from durable.controls.approvers import Approver, Approvers, standing_problem
from durable.log.state import Approval
from durable.security.signing import sign, statement, valid

#: What a signature is made over starts with this line (domain separation).
DOMAIN = b"durable-approval-v1\n"


def payload(run_id: str, request: str, digest: str, decision: str, expires_at: int) -> bytes:
    """The bytes an approver signs for one decision."""
    return statement(DOMAIN, {"decision": decision, "digest": digest,
                              "expires_at": int(expires_at), "request": request,
                              "run": run_id})


def sign_decision(private_key_pem: bytes, run_id: str, request: str, digest: str,
                  decision: str, expires_at: int) -> str:
    """The base64 Ed25519 signature of a decision, with a PEM (PKCS#8) private key."""
    return sign(private_key_pem, payload(run_id, request, digest, decision, expires_at))


def signature_valid(public_key: bytes, signature: str, run_id: str, request: str,
                    digest: str, decision: str, expires_at: int) -> bool:
    """Whether ``signature`` (base64) is the raw 32-byte ``public_key``'s over the decision."""
    return valid(public_key, signature, payload(run_id, request, digest, decision, expires_at))


def _now(now: int | None) -> int:
    return clock.now_ms() if now is None else now


# Checks -----------------------------------------------------------------------------------


def check_decision(approver: Approver | None, name: str, run_id: str, appr: Approval,
                   decision: str, signature: str, *, now: int | None = None,
                   decided_at: int | None = None) -> str | None:
    """Why ``name``'s signed ``decision`` on ``appr`` is not valid, or None when it is.

    ``now``: the time the key must be active at (revocation); ``decided_at``: the time the
    decision is made or was recorded, which must be before the request's expiry.
    """
    at = _now(now)
    problem = standing_problem(approver, name, appr.role, at, who="approver")
    if problem is not None or approver is None:
        return problem
    when = at if decided_at is None else decided_at
    if appr.expires and appr.expires <= when:
        return f"approval request {appr.request} expired"
    if not signature:
        return f"the decision on {appr.request} carries no signature"
    if not signature_valid(approver.key_bytes, signature, run_id, appr.request, appr.digest,
                           decision, appr.expires):
        return f"the signature is not {name}'s ({approver.fingerprint}) over this decision " \
               f"(run {run_id}, request {appr.request}, its digest, {decision!r}, its expiry)"
    return None


def check_recorded(registry: Approvers, run_id: str, appr: Approval,
                   now: int | None = None) -> str | None:
    """Why a decision recorded in the log does not hold (now), or None when it does.

    What the worker asks before it sends an approved call: the key must still be active.
    """
    if appr.decision is None:
        return None
    name = appr.approver or ""
    approver = registry.get(name) if name else None
    problem = check_decision(approver, name, run_id, appr, appr.decision, appr.sig,
                             now=now, decided_at=appr.decided_at)
    if problem is None and appr.key and approver is not None \
            and appr.key != approver.fingerprint:
        problem = f"the decision names key {appr.key}, {name}'s is {approver.fingerprint}"
    return problem


def check_history(registry: Approvers, run_id: str, appr: Approval) -> str | None:
    """Why a recorded decision was not valid when it was made, or None: what ``verify``
    asks (a key revoked after the decision does not make it invalid)."""
    if appr.decision is None:
        return None
    return check_recorded(registry, run_id, appr, now=appr.decided_at)
