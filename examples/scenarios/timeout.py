"""Scenario ``timeout``: the notification API applies the call but its reply comes too late.

The world holds the reply of the ``notify`` step past the tool's timeout (fault
``slow``, phase ``reply``). The worker must record ``action_timed_out`` (outcome unknown,
never "failed"), wait for the dispatch's deadline, ask ``lookup``, find the notification
and record it as applied, without sending it again: one request, one application.

Run it on its own: ``python -m examples.scenarios.timeout``.
"""

from __future__ import annotations

import sys

from durable.log import events as ev
from examples.agents.pipeline import Notify
from examples.scenarios.outcome import Outcome, collect, expect_common, of_type, recovery_rows
from examples.scenarios.stack import Scene

TITLE = "Timeout on a tool call"
WINDOW = "notify applied, reply held past the tool's timeout"
STEP = 4


def run(scene: Scene, out: Outcome) -> None:
    slow_s = Notify.timeout_s + 1.5
    scene.world.set_faults(target="notify", slow_next=1, slow_s=slow_s, slow_phase="reply")
    scene.worker()
    run_id = scene.start()
    out.run_id = run_id
    key = f"{run_id}:{STEP}"
    final = scene.wait(run_id, 30)
    entries, apps = collect(out, scene, run_id, final)
    timed_out = [e for e in entries if isinstance(e.event, ev.ActionTimedOut)]
    if timed_out:
        out.recovery = recovery_rows(scene, run_id, timed_out[0].id)
    expect_common(out, scene, run_id, apps, state="completed", final=final,
                  api={key: 1}, db={f"{run_id}:3": 1})
    out.expect("the call was recorded as timed out", [STEP],
               [e.step for e in of_type(entries, ev.ActionTimedOut)])
    out.expect("resolved by lookup as applied", ["applied"],
               [e.resolution for e in of_type(entries, ev.ActionReconciled, key=key)])
    out.expect("dispatches of the key", 1, len(of_type(entries, ev.ActionDispatched, key=key)))
    out.expect("requests the API received for the key", 1, len(scene.world.requests(key)))
    out.expect("faults injected", {"slow-reply": 1}, scene.world.injected())
    out.figures["reply held s"] = slow_s
    out.figures["tool timeout s"] = Notify.timeout_s


if __name__ == "__main__":
    from examples.scenarios.runner import main

    sys.exit(main(["timeout"]))
