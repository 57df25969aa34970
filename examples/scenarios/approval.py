"""Scenario ``approval``: the run waits for a person while holding nothing, then goes on once.

The ``announce`` agent (``examples.agents.approval``) fetches a source, sums it up and
publishes the summary through the notification API; ``publish`` requires an approval by
the role ``comms``. The worker records the request (a digest of the tool, its arguments and
the source's figures read then) and lets go: the run is ``waiting_approval``, its lease key
is gone, no worker holds a job for it, the key is not claimed and nothing was sent.

Approvers are keys: at the start the scene makes Ed25519 key pairs for alice (role comms)
and bob (role support) and registers their public keys, each entry signed by the stack's
admin key (``durable approvers add --admin-key``); each decision is signed with a private
key file (``Client.sign_and_approve``, what ``durable approve --key`` does). Refused, and
nothing written: bob (a valid signature, the wrong role), mallory (a key nobody
registered), eve (who wrote her own entry with role comms into the registry with a plain
HSET, as any Redis writer could: no admin signed it) and a decision in alice's name signed
with mallory's key. Alice's own signed approval is recorded with her key's fingerprint and
signature; the run resumes, the worker checks the signature again and reads the facts
again (same digest), dispatches ``publish`` once and completes: one notification, applied
after the decision; ``verify`` re-checks the recorded signature.

Run it on its own: ``python -m examples.scenarios.approval``.
"""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rq import Worker as RQWorker

from durable.audit.verify import verify
from durable.controls.digests import digest
from durable.errors import Refused
from durable.log import events as ev
from durable.log.state import Approval, RunState
from durable.log.store import now_ms
from durable.security.signing import fingerprint, keygen, load_public_key
from examples.scenarios.outcome import Outcome, collect, expect_common, of_type, recovery_rows
from examples.scenarios.stack import Scene

TITLE = "Approval wait"
WINDOW = "publish waits for role comms; wrong role, unknown key, self-registered key, " \
         "forged signature refused; a signed approval"
AGENT = "announce"
STEP = 3
ROLE = "comms"
#: Registered approvers and their roles; mallory's key is made but never registered, eve's
#: is written into the registry by hand, without an admin's signature.
APPROVERS = {"alice": [ROLE], "bob": ["support"]}
SELF_REGISTERED = {"eve": [ROLE]}
INPUT = {"source": "orders", "recipient": "customers@example.com", "threshold": 250.0}


def busy_jobs(scene: Scene) -> list[str]:
    """Jobs the scene's live workers are executing now."""
    return [job for w in RQWorker.all(queue=scene.client.queue)
            if (job := w.get_current_job_id()) is not None]


@dataclass
class Keys:
    """The scene's approver names (unique per scene: the registry outlives a scene on a
    shared server) and their private key files."""

    names: dict[str, str]
    files: dict[str, Path]


def make_keys(scene: Scene) -> Keys:
    """Key pairs for alice, bob and mallory; alice's and bob's public keys registered."""
    suffix = scene.queue.rsplit("-", 1)[-1]
    names = {who: f"{who}-{suffix}" for who in ("alice", "bob", "mallory", "eve")}
    files = {}
    for who, name in names.items():
        private, public = keygen()
        path = scene.stack.workdir / f"{name}.key"
        path.write_bytes(private)
        path.chmod(0o600)
        files[who] = path
        if who in APPROVERS:
            scene.client.approvers.add(name, APPROVERS[who], load_public_key(public),
                                       admin_key=scene.stack.admin.private, by="scenario")
        elif who in SELF_REGISTERED:
            raw = load_public_key(public)
            scene.client.redis.hset("dx:approvers", name, json.dumps({
                "roles": SELF_REGISTERED[who], "public_key": base64.b64encode(raw).decode(),
                "fingerprint": fingerprint(raw), "added": 0, "by": who, "revoked": 0}))
    return Keys(names, files)


def attempt(scene: Scene, out: Outcome, run_id: str, request: str, decision: str,
            who: str, keys_: Keys, signer: str | None = None) -> RunState | None:
    """One decision in ``who``'s name, signed with ``signer``'s key file (``who``'s by
    default), through the client; records what it answered and what it wrote."""
    before = scene.client.status(run_id).version
    n_before = len(scene.client.events(run_id))
    state: RunState | None = None
    signer = signer or who
    try:
        state = scene.client.sign_and_approve(run_id, request, decision, keys_.names[who],
                                              keys_.files[signer].read_bytes())
        answer = f"recorded; run {state.state}"
    except Refused as exc:
        answer = f"Refused: {exc.reason}"
    # What the decision wrote is what its answer says (each event is one version): once it
    # is recorded, a worker may take the run and write more before the log is read again.
    after = state.version if state is not None else scene.client.status(run_id).version
    out.decisions.append({
        "approver": who + ("" if signer == who else f" (signed with {signer}'s key)"),
        "roles": APPROVERS.get(who, SELF_REGISTERED.get(who, [])), "decision": decision,
        "answer": answer, "version before": before, "version after": after,
        "events written": after - before if state is not None
        else len(scene.client.events(run_id)) - n_before})
    return state


def request_row(appr: Approval, now: int) -> dict[str, Any]:
    return {"request": appr.request, "step": appr.step, "role": appr.role,
            "digest": appr.digest, "evidence": appr.evidence,
            "expires in s": round((appr.expires - now) / 1000), "decision": appr.decision,
            "approver": appr.approver}


def run(scene: Scene, out: Outcome) -> None:
    keys_ = make_keys(scene)
    scene.worker()
    run_id = scene.start(INPUT, agent=AGENT)
    out.run_id = run_id
    key = f"{run_id}:{STEP}"
    waiting = scene.wait(run_id, 20)
    if not out.expect("the run waits for approval", "waiting_approval", waiting.state):
        collect(out, scene, run_id, waiting)
        return
    check_waiting(scene, out, run_id, key, waiting)
    (request,) = [a.request for a in waiting.approvals.values() if a.decision is None]

    for who, signer, why in (("bob", None, f"does not have the role '{ROLE}'"),
                             ("mallory", None, "unknown approver"),
                             ("eve", None, "is not trusted"),
                             ("alice", "mallory", "signature is not")):
        refused = attempt(scene, out, run_id, request, "approve", who, keys_, signer)
        tried = out.decisions[-1]["approver"]
        out.expect(f"{tried} is refused ({why})", True,
                   refused is None and why in out.decisions[-1]["answer"])
        out.expect(f"the refusal of {tried} wrote nothing (events written)", 0,
                   out.decisions[-1]["events written"])
    out.expect("the run still waits after the refusals", "waiting_approval",
               scene.client.status(run_id).state)
    approved = attempt(scene, out, run_id, request, "approve", "alice", keys_)
    out.expect("alice (role comms, her key) approves: decision and wait resolved written, "
               "run pending", (2, "pending"),
               (out.decisions[-1]["events written"],
                approved.state if approved is not None else out.decisions[-1]["answer"]))

    final = scene.wait(run_id, 20)
    entries, apps = collect(out, scene, run_id, final)
    out.approvals = [request_row(a, now_ms()) for a in final.approvals.values()]
    decided = [e for e in entries if isinstance(e.event, ev.ApprovalDecided)]
    if decided:
        out.recovery = recovery_rows(scene, run_id, decided[0].id)
    expect_common(out, scene, run_id, apps, state="completed", final=final,
                  api={key: 1}, db={})
    out.expect("source reads per key", {f"{run_id}:1": 1}, apps.reads)
    out.expect("approval requests in the log (facts unchanged: no second one)", [request],
               [e.request for e in of_type(entries, ev.ApprovalRequested)])
    alice = scene.client.approvers.get(keys_.names["alice"])
    out.expect("decisions in the log: alice's, naming her key, signed",
               [(request, "approve", keys_.names["alice"], alice.fingerprint if alice else "?",
                 True)],
               [(e.request, e.decision, e.approver, e.key, bool(e.sig))
                for e in of_type(entries, ev.ApprovalDecided)])
    out.expect("verify re-checks the recorded signature", "ok",
               verify(scene.client.log, run_id).checks.get("approvals_signed"))
    out.expect("dispatches of the key", 1, len(of_type(entries, ev.ActionDispatched, key=key)))
    out.expect("requests the API received for the key", ["applied"],
               [r["disposition"] for r in scene.world.requests(key)])
    decided_ts = [e.ts for e in of_type(entries, ev.ApprovalDecided)]
    applied_ms = [r["applied_ms"] for r in scene.world.application_rows(run_id)
                  if r["key"] == key]
    out.expect("the notification was applied after the approval", True,
               bool(decided_ts) and bool(applied_ms) and min(applied_ms) >= decided_ts[0])
    ids = [e.id for e in entries]
    leases = [e.id for e in entries if isinstance(e.event, ev.LeaseAcquired)]
    out.expect("a worker took the run again after the decision", True,
               bool(decided) and any(ids.index(x) > ids.index(decided[0].id) for x in leases))
    result = final.result or {}
    out.expect("result: published, with the notification", True,
               result.get("published") is True and bool(result.get("notification_id")))
    entered = of_type(entries, ev.WaitEntered, kind="approval")
    resolved = of_type(entries, ev.WaitResolved, kind="approval")
    if entered and resolved:
        out.figures["approval wait ms"] = resolved[0].ts - entered[0].ts
    out.figures["request"] = request
    out.figures["events"] = len(entries)


def check_waiting(scene: Scene, out: Outcome, run_id: str, key: str, state: RunState) -> None:
    """While the run waits: no lease, no job, no claim, nothing sent; the request itself."""
    redis = scene.client.redis
    out.expect(f"lease key {scene.client.log.keys.lease(run_id)} while waiting", 0,
               redis.exists(scene.client.log.keys.lease(run_id)))
    scene.wait_for("the worker to let go of the job", lambda: not busy_jobs(scene), 5)
    out.expect("jobs the workers hold while waiting", [], busy_jobs(scene))
    out.expect("ledger entry of the key while waiting (not claimed)", None,
               redis.hget(scene.client.log.keys.ledger(run_id), key))
    apps = scene.world.applications(run_id)
    out.expect("world applications while waiting (api, db)", ({}, {}), (apps.api, apps.db))
    out.expect("requests the API received for the key while waiting", [],
               scene.world.requests(key))
    pending = [a for a in state.approvals.values() if a.decision is None]
    if not out.expect("open approval requests", 1, len(pending)):
        raise AssertionError(f"expected one open approval request, found {state.approvals}")
    appr = pending[0]
    now = now_ms()
    out.approvals = [request_row(appr, now)]
    out.expect("request: step, role", (STEP, ROLE), (appr.step, appr.role))
    act = state.actions[STEP]
    records = state.actions[1].result["records"]
    facts = {"source": INPUT["source"], "count": len(records),
             "total": round(sum(r["amount"] for r in records), 2)}
    out.expect("digest == sha256(publish, its arguments, the source's figures)",
               digest("publish", act.args, facts), appr.digest)
    out.expect("evidence: the source's URL, then the message", [
        f"{scene.stack.world.url}/source/{INPUT['source']}",
        f"to {INPUT['recipient']}: {act.args['message']}"], appr.evidence)
    out.expect("request expires within the tool's approval_ttl_s (1 h)", True,
               0 < appr.expires - now <= 3600 * 1000)
    out.expect("the wait names the request", appr.request,
               state.wait.request if state.wait else None)


if __name__ == "__main__":
    from examples.scenarios.runner import main

    sys.exit(main(["approval"]))
