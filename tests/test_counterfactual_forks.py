"""Counterfactual forks (``durable fork RUN --at N --set ... --hold-effects``, ``durable
diff``): a code agent that asks the local model server (real HTTP) and charges a card (a
real row of the tests' SQLite database, with no unique key: only the system stands between
a release and a second charge), driven by real worker processes. A fork under a new prompt
charges nothing; its held charge, released by a signed decision, is applied once, also when
the worker is SIGKILLed right after applying it; a fork whose calls are the parent's reuses
their outcomes and sends nothing."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

import tests.agents.counterfactual  # noqa: F401  (the client plans with the agents)
from durable.audit.diff import diff
from durable.audit.replay import describe
from durable.audit.verify import verify
from durable.cli import main
from durable.client import Client
from durable.errors import UsageError
from durable.log import events as ev
from durable.testing import wait_for
from tests.agents.basic import applications
from tests.conftest import ApproverFactory, ModelFactory, WorkerFactory
from tests.runs import events_of
from tests.servers.model import ModelServer

AGENTS = "examples.agents,tests.agents.basic,tests.agents.counterfactual"


@pytest.fixture()
def model(serve_model: ModelFactory, world_db: Any) -> ModelServer:
    return serve_model(AGENTS, tokens=5)


def _charges(world_db: Any, run: str) -> dict[str, int]:
    return {k: n for k, n in applications(str(world_db)).items() if k.startswith(f"{run}:")}


def _shopped(client: Client, worker: WorkerFactory, world_db: Any) -> str:
    run = client.start("card_shopper", {"cents": 1000}, run_id="shop").run_id
    worker(burst=True).wait(60)
    assert client.wait(run, 30).state == "completed"
    assert _charges(world_db, run) == {f"{run}:2": 1, f"{run}:3": 1}
    return run


def _held_fork(client: Client, worker: WorkerFactory, run: str) -> str:
    fork = client.fork(run, "1", "shop-v2", overrides={"prompt": "v2"},
                       hold_effects=True).run_id
    worker(burst=True).wait(60)
    assert client.wait(fork, 30).state == "waiting_approval"
    return fork


def test_a_fork_with_a_new_prompt_charges_nothing_and_its_diff_names_the_first_step(
        client: Client, worker: WorkerFactory, model: ModelServer, world_db: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    """From step 1 under prompt v2: the model is asked again (a request is effect-free),
    the charge of 900 the new prompt leads to is held with what it would send, nothing is
    charged, and the diff parts at step 1 (another request digest)."""
    run = _shopped(client, worker, world_db)
    fork = _held_fork(client, worker, run)
    state = client.status(fork)
    assert state.wait is not None and state.wait.data["held"] is True
    assert state.wait.data["tool"] == "charge" and state.wait.data["args"]["n"] == 900
    assert _charges(world_db, fork) == {}  # the counting database: 0 applications
    assert not [e for e in events_of(client, fork) if isinstance(e, ev.ActionDispatched)
                and e.step >= 2]
    assert verify(client.log, fork).ok

    found = diff(client.log, run, fork)
    assert found.first == 1
    step2 = next(row for row in found.rows if row["step"] == 2)
    assert step2["b"]["held"] and step2["b"]["outcome"] == "held" and not step2["b"]["sent"]
    assert found.b.totals()["effects_sent"] == 0 and found.a.totals()["effects_sent"] == 2
    capsys.readouterr()
    assert main(["diff", run, fork, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["first_divergence"] == 1 and shown["totals"][fork]["held"] == 1
    assert main(["diff", run, fork]) == 0
    assert "first divergence: step 1" in capsys.readouterr().out


def test_a_released_held_charge_is_applied_once_even_if_the_worker_dies_right_after(
        client: Client, worker: WorkerFactory, model: ModelServer, world_db: Any,
        approver: ApproverFactory) -> None:
    """Crash window: the worker is SIGKILLed after the released charge was applied, before
    its outcome is recorded. The next worker looks the key up (applied) instead of sending
    it again: one charge. The receipt after it is simulated (its tool ``simulates``), and
    the fork completes having charged 900 once and sent no receipt."""
    run = _shopped(client, worker, world_db)
    fork = _held_fork(client, worker, run)
    request = client.status(fork).wait.request  # type: ignore[union-attr]
    ops = approver("ops", "approver")
    client.sign_and_approve(fork, request, "approve", "ops", ops)
    assert worker(kill_at="after_effect:2").wait(60) == -signal.SIGKILL
    assert _charges(world_db, fork) == {f"{fork}:2": 1}
    assert client.status(fork).actions[2].status == "dispatched"  # no outcome recorded
    assert wait_for(lambda: client.redis.get(client.log.keys.lease(fork)) is None, 10)
    client.enqueue(fork, force=True)
    worker(burst=True).wait(60)
    final = client.wait(fork, 30)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result["charged"] == 900 and final.result["receipt"]["simulated"]
    assert _charges(world_db, fork) == {f"{fork}:2": 1}  # once; the receipt never sent
    succeeded = {e.step: e for e in events_of(client, fork) if isinstance(e, ev.ActionSucceeded)}
    assert succeeded[3].simulated
    assert "simulated (nothing sent)" in describe(succeeded[3])
    assert verify(client.log, fork).ok


def test_a_fork_taking_the_parents_calls_reuses_their_outcomes_and_sends_no_effect(
        client: Client, worker: WorkerFactory, model: ModelServer, world_db: Any) -> None:
    """Another model for the request (sent), the same charge and receipt at the same steps
    (reused, naming the parent's keys: nothing sent); with ``reuse_replies`` and a change
    the requests do not see, the model is not asked either."""
    run = _shopped(client, worker, world_db)
    asked = len(model.seen)
    other = client.fork(run, "1", "shop-model", overrides={"model": "other"},
                        hold_effects=True).run_id
    worker(burst=True).wait(60)
    assert client.wait(other, 30).state == "completed"
    assert len(model.seen) == asked + 1 and model.seen[-1].body["model"] == "other"
    reused = {e.step: e.reused for e in events_of(client, other)
              if isinstance(e, ev.ActionSucceeded) and e.reused}
    assert reused == {2: f"{run}:2", 3: f"{run}:3"}
    shown = [describe(e) for e in events_of(client, other) if isinstance(e, ev.ActionSucceeded)]
    assert any(f"reuses the outcome of {run}:2" in line for line in shown), shown
    assert _charges(world_db, other) == {}

    same = client.fork(run, "1", "shop-same", overrides={"tone": "warm"}, hold_effects=True,
                       reuse_replies=True).run_id
    worker(burst=True).wait(60)
    assert client.wait(same, 30).state == "completed"
    assert len(model.seen) == asked + 1  # the identical request's reply was reused
    assert diff(client.log, run, same).first == 0
    assert _charges(world_db, same) == {}


def test_a_fork_of_many_runs_sums_up_where_they_diverge_and_what_they_would_send(
        client: Client, worker: WorkerFactory, model: ModelServer, world_db: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``durable fork --where``: both completed runs of the agent forked under prompt v2,
    the forks driven by a running worker while the command waits: both diverge at step 1,
    each holds its charge of 900, nothing is charged."""
    _shopped(client, worker, world_db)
    client.start("card_shopper", {"cents": 2000}, run_id="shop2")
    worker(burst=True).wait(60)
    assert client.wait("shop2", 30).state == "completed"
    worker()
    capsys.readouterr()
    assert main(["fork", "--where", "agent=card_shopper,since=1h", "--at", "1", "--set",
                 "prompt=v2", "--hold-effects", "--wait", "60", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["summary"] == {"runs": 2, "diverged": 2, "first_divergence": {"1": 2},
                                "held": 2, "simulated": 0, "reused": 0, "effects_sent": 0}
    held = sorted(h["args"]["n"] for f in shown["forks"] for h in f["held"])
    assert held == [900, 1900]
    forks = [f["fork"] for f in shown["forks"]]
    assert all("-whatif-" in f for f in forks)
    assert not [k for k in applications(str(world_db)) if "-whatif-" in k]
    # The forks are held forks: a second --where leaves them out.
    assert main(["fork", "--where", "agent=card_shopper,state=waiting_approval", "--at", "1",
                 "--hold-effects", "--wait", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["runs"] == 0


def test_a_held_fork_of_a_decide_agent_reuses_the_same_decisions(
        client: Client, worker: WorkerFactory, model: ModelServer, world_db: Any) -> None:
    """A ``decide()`` agent forked at step 3 with effects held: it decides the parent's
    calls again, each reused from the parent's log, and completes with nothing sent."""
    run = client.start("count", {"steps": 4}, run_id="counted").run_id
    worker(burst=True).wait(60)
    assert client.wait(run, 30).state == "completed"
    fork = client.fork(run, "3", "counted-held", hold_effects=True).run_id
    worker(burst=True).wait(60)
    final = client.wait(fork, 30)
    assert final.state == "completed" and final.result == {"steps": 4}
    events = events_of(client, fork)
    assert {e.step: e.reused for e in events if isinstance(e, ev.ActionSucceeded)
            and e.step >= 3} == {3: f"{run}:3", 4: f"{run}:4"}
    assert diff(client.log, run, fork).first == 0
    assert diff(client.log, run, fork).b.totals()["sent"] == 0


def test_a_parallel_decision_in_a_held_fork_is_reused_or_quarantined_never_sent(
        client: Client, worker: WorkerFactory, model: ModelServer, world_db: Any) -> None:
    """The charge and the receipt in one parallel decision: under another model, both are
    the parent's calls and are reused; under prompt v2 the charge would be held, which a
    group cannot be (a release is of one call): the fork is quarantined, naming it, with
    nothing sent."""
    run = client.start("card_splitter", {"cents": 1000}, run_id="split").run_id
    worker(burst=True).wait(60)
    assert client.wait(run, 30).state == "completed"
    same = client.fork(run, "1", "split-model", overrides={"model": "other"},
                       hold_effects=True).run_id
    v2 = client.fork(run, "1", "split-v2", overrides={"prompt": "v2"},
                     hold_effects=True).run_id
    worker(burst=True).wait(60)
    assert client.wait(same, 30).state == "completed"
    assert {e.step: e.reused for e in events_of(client, same)
            if isinstance(e, ev.ActionSucceeded) and e.reused} == {2: f"{run}:2",
                                                                  3: f"{run}:3"}
    held = client.wait(v2, 30, waiting=False)
    assert held.state == "quarantined" and "charge (step 2) would be held" in (held.reason
                                                                                or "")
    assert _charges(world_db, same) == _charges(world_db, v2) == {}
    assert not [e for e in events_of(client, v2) if isinstance(e, ev.ActionDispatched)
                and e.step >= 2]


def test_bad_fork_options_are_refused_before_anything_is_written(
        client: Client, worker: WorkerFactory, model: ModelServer, world_db: Any) -> None:
    run = _shopped(client, worker, world_db)
    with pytest.raises(UsageError, match="--hold-effects"):
        client.fork(run, "1", "f1", overrides={"prompt": "v2"})
    with pytest.raises(UsageError, match="took no step 9"):
        client.fork(run, "9", "f2", hold_effects=True)
    assert main(["fork", run, "--at", "1", "--set", "prompt", "--hold-effects"]) == 2
    assert main(["fork", "--where", "agent=card_shopper,colour=red", "--at", "1",
                 "--hold-effects"]) == 2
    assert main(["fork", "--where", "agent=card_shopper", "--at", "1"]) == 2
    assert not client.redis.exists(client.log.keys.log("f1"), client.log.keys.log("f2"))
    assert os.environ["DURABLE_AGENTS"] == AGENTS
