"""Scenario ``crash``: the worker is SIGKILLed between an effect and its outcome.

Window ``after_effect:3``: the ``write`` step's row is in the database, its outcome is not
in the log. A fresh worker and the reconciler (or the recovery loop) take over once the
lease has expired; the worker waits for the dispatch's deadline, asks ``lookup``, finds
the row, records it as applied, and goes on. The database must hold exactly one row for
the key, and the API exactly one notification.

Run it on its own: ``python -m examples.scenarios.crash``.
"""

from __future__ import annotations

import signal
import sys

from durable.log import events as ev
from durable.log.store import now_ms
from examples.scenarios.outcome import (
    Outcome,
    expect_common,
    of_type,
    recover,
)
from examples.scenarios.stack import Scene

TITLE = "Crash mid-run"
WINDOW = "after_effect:3 (row written, outcome not recorded)"
STEP = 3


def run(scene: Scene, out: Outcome) -> None:
    doomed = scene.worker(kill_at=f"after_effect:{STEP}")
    run_id = scene.start()
    out.run_id = run_id
    key = f"{run_id}:{STEP}"
    code = doomed.wait(30)
    killed_at = now_ms()
    out.expect("first worker died of SIGKILL", -signal.SIGKILL, code)
    out.expect("the effect happened before the crash (db rows for the key)", 1,
               scene.world.applications(run_id).db.get(key, 0))
    ledger = (scene.client.redis.hget(scene.client.log.keys.ledger(run_id), key) or b"").decode()
    out.expect("ledger: key claimed, no outcome", "claimed", ledger.split("|")[0])
    out.expect("run left without an outcome", "dispatched",
               scene.client.status(run_id).actions[STEP].status)

    final, entries, apps = recover(out, scene, run_id, killed_at)
    expect_common(out, scene, run_id, apps, state="completed", final=final,
                  api={f"{run_id}:4": 1}, db={key: 1})
    out.expect("dispatches of the crashed key", 1,
               len(of_type(entries, ev.ActionDispatched, key=key)))
    out.expect("resolved by lookup as applied", ["applied"],
               [e.resolution for e in of_type(entries, ev.ActionReconciled, key=key)])
    owners = {e.owner for e in of_type(entries, ev.LeaseAcquired)}
    out.expect("a second worker took over", True, len(owners) >= 2)


if __name__ == "__main__":
    from examples.scenarios.runner import main

    sys.exit(main(["crash"]))
