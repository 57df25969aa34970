"""Settling an unknown outcome by a signed operator decision.

A step whose outcome is *unknown* and whose tool's ``lookup`` cannot tell (a tool with no
lookup, a system that keeps no record) would wait for ever. An operator who found out
(from a log, a bank statement, the other system's console) settles it: ``applied`` (with
the result the call gave, the step counts as succeeded) or ``not_applied`` (the step is
sent again with the same key), with the evidence in words. The decision counts only with
an Ed25519 signature by a key an admin registered (``durable.controls.approvers``) holding the
settle role (``DURABLE_SETTLE_ROLE``, ``operator``), made over::

    b"durable-settle-v1\\n" + canonical JSON of
    {"attempt", "digest", "evidence", "key", "resolution", "run", "step"}

``attempt`` is the step's dispatch count when it was settled: a signature made for one
unknown attempt never settles a later one. ``digest`` is the SHA-256 of the result's
canonical JSON (of ``null`` for ``not_applied``).

It is recorded as ``action_reconciled`` with ``by="operator"`` and the signer's name, key
fingerprint, signature, evidence and digest (older readers fold it as any reconciliation).
The client checks the decision before writing it (``settle``: refused, nothing written);
the worker checks every recorded one when it takes or reloads a run (``unsigned_settle``:
one that does not hold quarantines the run, so it is never acted on); ``durable verify``
re-checks them (``check_event``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from durable.contention import update_run
from durable.controls.approvers import Approver, Approvers, standing_problem
from durable.errors import Refused, UsageError
from durable.log import events as ev
from durable.log.state import Action, RunState, SettleInfo
from durable.log.store import EventLog, RunHandle, Spec, now_ms
from durable.security.sealing import contains_envelope
from durable.security.signing import sign, statement, valid

#: What a settle signature is made over starts with this line (domain separation).
DOMAIN = b"durable-settle-v1\n"

#: ``action_reconciled.by`` of a settle.
BY = "operator"

RESOLUTIONS = ("applied", "not_applied")


def result_digest(result: Any) -> str:
    """SHA-256 (hex) of the result's canonical JSON (sorted keys)."""
    return hashlib.sha256(msgspec.json.encode(result, order="sorted")).hexdigest()


def payload(run_id: str, step: int, key: str, attempt: int, resolution: str, digest: str,
            evidence: str) -> bytes:
    """The bytes an operator signs to settle one step."""
    return statement(DOMAIN, {"attempt": int(attempt), "digest": digest, "evidence": evidence,
                              "key": key, "resolution": resolution, "run": run_id,
                              "step": int(step)})


def sign_settle(private_key_pem: bytes, run_id: str, act: Action, resolution: str,
                result: Any, evidence: str) -> str:
    """The base64 signature settling ``act`` as it is recorded now (its key, attempt)."""
    return sign(private_key_pem, payload(run_id, act.step, act.key, act.attempts, resolution,
                                         result_digest(result), evidence))


def check(signer: Approver | None, name: str, role: str, run_id: str, info: SettleInfo,
          step: int, key: str, at: int) -> str | None:
    """Why the settle ``info`` of ``step`` by ``name`` is not valid at time ``at``, or None."""
    problem = standing_problem(signer, name, role, at, purpose=" needed to settle")
    if problem is not None or signer is None:
        return problem
    if info.key and info.key != signer.fingerprint:
        return f"the settle names key {info.key}, {name}'s is {signer.fingerprint}"
    if not info.sig:
        return f"the settle of step {step} carries no signature"
    message = payload(run_id, step, key, info.attempt, info.resolution, info.digest,
                      info.evidence)
    if not valid(signer.key_bytes, info.sig, message):
        return f"the signature is not {name}'s ({signer.fingerprint}) over this settle " \
               f"(run {run_id}, step {step}, its key and attempt, {info.resolution!r}, " \
               "the result's digest, the evidence)"
    return None


def check_action(registry: Approvers, role: str, run_id: str, act: Action) -> str | None:
    """Why ``act``'s recorded settle did not hold when it was made (None: it did, or there
    is none). The result must also be the one signed for."""
    info = act.settle
    if info is None:
        return None
    problem = check(registry.get(info.by) if info.by else None, info.by, role, run_id,
                    info, act.step, act.key, info.at)
    if problem is None and info.resolution == "applied" and act.blob is None \
            and result_digest(act.result) != info.digest:
        problem = f"the result recorded for step {act.step} is not the one signed for"
    return problem


def unsigned_settle(registry: Approvers, role: str, state: RunState) -> str | None:
    """What the worker asks of a run it takes: a settle the fold applied must hold."""
    for act in state.actions.values():
        problem = check_action(registry, role, state.run_id, act)
        if problem is not None:
            return f"the settle of step {act.step} does not hold: {problem}"
    return None


def check_event(registry: Approvers, role: str, run_id: str,
                e: ev.ActionReconciled) -> str | None:
    """``verify``'s check of one recorded ``action_reconciled``; None unless it is a settle
    that does not hold."""
    if e.by != BY:
        return None
    info = info_of(e)
    problem = check(registry.get(e.operator) if e.operator else None, e.operator, role,
                    run_id, info, e.step, e.key, e.ts)
    if problem is None and e.resolution == "applied" and e.blob is None \
            and not contains_envelope(e.result) and result_digest(e.result) != e.result_digest:
        problem = f"the result recorded for step {e.step} is not the one signed for"
    return problem


def info_of(e: ev.ActionReconciled) -> SettleInfo:
    return SettleInfo(by=e.operator, key=e.operator_key, sig=e.sig, evidence=e.evidence,
                      digest=e.result_digest, attempt=e.attempt, at=e.ts,
                      resolution=e.resolution)


# Recording ----------------------------------------------------------------------------------


def settle(elog: EventLog, registry: Approvers, role: str, run_id: str, step: int,
           resolution: str, result: Any, evidence: str, signer: str, signature: str,
           *, max_bytes: int = 256 * 1024) -> RunState:
    """Record a signed settle of ``step``'s unknown outcome; the run goes on.

    Refused (``Refused``, nothing written): a step that is not unknown (never dispatched,
    in flight, settled), a ``not_applied`` before the dispatch's deadline passed (a slow
    first attempt could still land), a terminal or quarantined run, no evidence, and a
    signature that is not ``signer``'s registered key's, with ``role``, over this run,
    step, key, attempt, resolution, result and evidence.
    """
    if resolution not in RESOLUTIONS:
        raise UsageError(f"resolution must be one of {', '.join(RESOLUTIONS)}")
    if not evidence.strip():
        raise UsageError("a settle needs --evidence: what shows the call did or did not apply")
    if resolution == "not_applied" and result is not None:
        raise UsageError("a not_applied settle has no result")
    if len(msgspec.json.encode(result)) > max_bytes:
        raise UsageError(f"the result exceeds {max_bytes} bytes (DURABLE_MAX_PAYLOAD_BYTES)")
    def write(handle: RunHandle) -> RunState:
        state = handle.state
        act = state.actions.get(step)
        if state.terminal or state.state == "quarantined":
            raise Refused(run_id, f"the run is {state.state}; nothing to settle")
        if act is None or act.status != "unknown":
            what = "not a step of this run" if act is None else f"{act.status}, not unknown"
            raise Refused(run_id, f"step {step} is {what}; only an unknown outcome is settled")
        if resolution == "not_applied" and act.deadline > now_ms():
            raise Refused(run_id, f"step {step}'s dispatch deadline has not passed: a slow "
                          "attempt could still apply it, so not_applied proves nothing yet")
        entry = registry.get(signer)
        info = SettleInfo(by=signer, key=entry.fingerprint if entry else "", sig=signature,
                          evidence=evidence, digest=result_digest(result),
                          attempt=act.attempts, at=now_ms(), resolution=resolution)
        problem = check(entry, signer, role, run_id, info, step, act.key, info.at)
        if problem is not None or entry is None:
            raise Refused(run_id, problem or f"unknown signer {signer!r}")
        specs = [Spec(ev.ActionReconciled, {
            "step": step, "key": act.key, "resolution": resolution, "result": result,
            "by": BY, "operator": signer, "operator_key": entry.fingerprint,
            "sig": signature, "evidence": evidence, "result_digest": info.digest,
            "attempt": act.attempts})]
        wait = state.wait
        if wait is not None and wait.kind == "external" and wait.request == act.key:
            specs.append(Spec(ev.WaitResolved, {"kind": "external", "request": act.key,
                                                "response": {"settled": resolution},
                                                "by": signer}))
        elog.commit(handle, specs)
        return handle.state

    return update_run(elog, run_id, signer, write)


def waits_for_settle(state: RunState) -> Action | None:
    """The unknown step a run waits on an operator to settle (its lookup cannot tell), or
    None."""
    wait = state.wait
    if state.state != "waiting_external" or wait is None:
        return None
    for act in state.actions.values():
        if act.key == wait.request and act.status == "unknown":
            return act
    return None
