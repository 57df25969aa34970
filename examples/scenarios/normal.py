"""Scenario ``normal``: one run of ``pipeline`` from start to finish, nothing injected.

Must end ``completed`` with one read of the source, one row in the database, one
notification, and a log with no unknown outcome in it.

Run it on its own: ``python -m examples.scenarios.normal``.
"""

from __future__ import annotations

import sys

from durable.log import events as ev
from examples.scenarios.outcome import Outcome, collect, expect_common, of_type
from examples.scenarios.stack import Scene

TITLE = "Normal completion"
WINDOW = "none: the happy path"


def run(scene: Scene, out: Outcome) -> None:
    scene.worker()
    run_id = scene.start()
    out.run_id = run_id
    final = scene.wait(run_id, 30)
    entries, apps = collect(out, scene, run_id, final)
    expect_common(out, scene, run_id, apps, state="completed", final=final,
                  api={f"{run_id}:4": 1}, db={f"{run_id}:3": 1})
    out.expect("source reads per key", {f"{run_id}:1": 1}, apps.reads)
    out.expect("unknown outcomes in the log", 0,
               len(of_type(entries, ev.ActionTimedOut) + of_type(entries, ev.ActionInterrupted)))
    result = final.result or {}
    out.expect("result carries the report and the notification",
               True, bool(result.get("report_id")) and bool(result.get("notification_id")))
    out.figures["events"] = len(entries)


if __name__ == "__main__":
    from examples.scenarios.runner import main

    sys.exit(main(["normal"]))
