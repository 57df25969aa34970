"""Scenario ``cancel``: an operator cancels the run while its ``notify`` call is in flight.

The API holds the request before applying it (fault ``slow``, phase ``apply``). While it
is held, ``client.cancel`` records ``cancel_requested`` and publishes the hint; the
worker signals the tool, which asks the API to abort this attempt (the API confirms it
never applied it and never will) and raises ``Cancelled``; the run ends ``canceled``.
No application (API or database) may start after the cancel-requested event, and the
held request, when the API gets to it, must be refused.

Run it on its own: ``python -m examples.scenarios.cancel``.
"""

from __future__ import annotations

import sys

from durable.log import events as ev
from examples.scenarios.outcome import Outcome, collect, expect_common, of_type, recovery_rows
from examples.scenarios.stack import Scene

TITLE = "Cancellation while a tool runs"
WINDOW = "notify request held by the API, cancel mid-flight"
STEP = 4
HOLD_S = 3.0


def run(scene: Scene, out: Outcome) -> None:
    scene.world.set_faults(target="notify", slow_next=1, slow_s=HOLD_S, slow_phase="apply")
    scene.worker()
    run_id = scene.start()
    out.run_id = run_id
    key = f"{run_id}:{STEP}"
    scene.wait_for("notify request at the API", lambda: scene.world.requests(key), 20)
    scene.client.cancel(run_id, "operator: stop the pipeline")
    final = scene.wait(run_id, 15)
    scene.wait_for("the held request to be settled", lambda: all(
        r["disposition"] != "pending" for r in scene.world.requests(key)), HOLD_S + 5)
    entries, apps = collect(out, scene, run_id, final)
    requested = of_type(entries, ev.CancelRequested)
    if not requested:
        out.error = "no cancel_requested event in the log"
        return
    cancel_ts = requested[0].requested_ts
    first = next(e.id for e in entries if isinstance(e.event, ev.CancelRequested))
    out.recovery = recovery_rows(scene, run_id, first)
    expect_common(out, scene, run_id, apps, state="canceled", final=final,
                  api={}, db={f"{run_id}:3": 1})
    late = [r for r in scene.world.application_rows(run_id) if r["applied_ms"] >= cancel_ts]
    out.expect("applications started after the cancel request", [], late)
    out.expect("the tool honoured the token (call canceled)", [STEP],
               [e.step for e in of_type(entries, ev.CallCanceled)])
    out.expect("the held request was refused by the API", ["refused_aborted"],
               [r["disposition"] for r in scene.world.requests(key)])
    latency = [e.latency_ms for e in of_type(entries, ev.Canceled)]
    out.expect("one canceled event", 1, len(latency))
    if latency:
        out.figures["cancel latency ms"] = latency[0]
        out.expect("cancel latency under 5 s", True, latency[0] < 5000)


if __name__ == "__main__":
    from examples.scenarios.runner import main

    sys.exit(main(["cancel"]))
