"""The ``announce`` agent: fetch -> transform -> publish, and publishing needs an approval.

The template for an effect a person must approve first. Its ``publish`` tool is the
pipeline's ``notify`` (the key and the deadline downstream, ``lookup`` by key) plus:

- ``requires_approval = True``: the worker does not dispatch the call. It records an
  approval request, bound to a digest of the tool, its arguments and its facts, and lets
  go: the run is ``waiting_approval``, holds no lease and no worker, and nothing is sent.
- ``approver_role = "comms"``: only a decision signed by an approver key registered with
  that role by the registry's admin (``durable approvers add alice --role comms
  --public-key alice.pub --admin-key admin.key``) counts;
  any other is refused and nothing is written.
- ``approval_facts(args)``: what the decision depends on besides the arguments, read now
  from the authoritative system (the source's figures the message reports). They are read
  again right before the approved call runs: if they changed, the approval no longer holds
  and a new one is asked for.
- ``evidence(args)``: what the approver should look at.

Once approved, the call goes out like any other: ``publish`` is sent once, and after an
unknown outcome it is looked up by key, never sent blindly. A rejection is an outcome the
agent handles (it finishes, unpublished). Try it::

    durable approvers keygen admin                              # the registry's admin
    export DURABLE_ADMIN_KEYS=$PWD/admin.pub                    # for every process
    durable approvers keygen alice                              # alice.key, alice.pub
    durable approvers add alice --role comms --public-key alice.pub --admin-key admin.key
    python -m examples world &
    durable worker &
    durable start announce --input '{"source": "orders"}'      # prints the run id
    durable status RUN              # waiting_approval: the request id, its role
    durable approve RUN --request REQUEST --decision approve --approver alice --key alice.key
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from pydantic import Field

from durable.agents import Agent, Call, Decision, Fail, Finish, register
from durable.log.state import RunState
from examples.agents.pipeline import Notify, PipelineInput, _http, check_refusals, world


@register
class Publish(Notify):
    """A notification to the outside world: sent only once an approver said yes."""

    name = "publish"
    requires_approval = True
    approver_role = "comms"
    approval_ttl_s = 3600.0

    def approval_facts(self, args: dict[str, Any]) -> dict[str, Any]:
        # Read from the source itself (not from the run's earlier results): what the
        # message claims must still be true when it is sent.
        resp = _http.get(f"{world()}/source/{quote(args['source'], safe='')}", timeout=5)
        check_refusals(resp)
        records = resp.json()["records"]
        return {"source": args["source"], "count": len(records),
                "total": round(sum(r["amount"] for r in records), 2)}

    def evidence(self, args: dict[str, Any]) -> list[str]:
        return [f"{world()}/source/{quote(args['source'], safe='')}",
                f"to {args['recipient']}: {args['message']}"]


class AnnounceInput(PipelineInput):
    """The pipeline's input; announcements go to customers by default."""

    recipient: str = Field(default="customers@example.com", min_length=3, max_length=200)


@register
class Announce(Agent):
    name = "announce"
    version = "1"
    input_model = AnnounceInput
    tools = ("fetch", "transform", "publish")

    def decide(self, state: RunState) -> Decision:
        inp = state.input
        last = state.last
        if last is not None and last.status == "rejected":
            return Finish({"source": inp["source"], "published": False,
                           "why": last.error or "rejected"})
        if last is not None and last.status != "succeeded":
            return Fail(f"step {last.step} ({last.tool}) {last.status}: {last.error or ''}")
        results = {step: act.result for step, act in state.actions.items()}
        if state.step == 0:
            return Call("fetch", {"source": inp["source"]})
        if state.step == 1:
            return Call("transform", {"records": results[1]["records"],
                                      "threshold": inp["threshold"]})
        summary = results[2]
        if state.step == 2:
            message = (f"{inp['source']}: {summary['count']} records, total "
                       f"{summary['total']}, {len(summary['flagged'])} flagged")
            return Call("publish", {"source": inp["source"], "recipient": inp["recipient"],
                                    "message": message})
        return Finish({"source": inp["source"], "published": True, "total": summary["total"],
                       "notification_id": results[3]["notification_id"]})
