"""Scenario ``replay``: recovery is replay, and replay changes nothing.

Window ``after_intent:4``: the worker records the ``notify`` intent and claims its key,
then dies before sending anything. After recovery (``lookup`` says not applied, past the
deadline: the step is sent again, once), the finished run's log is replayed:

- ``replay.replay`` / ``replay.state_at`` from offset 0, from a middle offset, and at
  every entry, rebuild the same state as a plain fold of the events up to there (through
  the nearest checkpoint: the workers checkpoint every 10 events here);
- ``client.status`` (recovery from the last checkpoint) equals the fold of the whole log;
- re-driving the finished run (``client.enqueue(run, force=True)`` and a worker) appends
  nothing and applies nothing in the world.

Run it on its own: ``python -m examples.scenarios.replay``.
"""

from __future__ import annotations

import signal
import sys

import msgspec

from durable.audit.replay import replay, state_at, trajectory
from durable.log import events as ev
from durable.log.fold import fold
from durable.log.store import now_ms
from examples.scenarios.outcome import (
    Outcome,
    collect,
    expect_common,
    first_after,
    of_type,
    recovery_rows,
)
from examples.scenarios.stack import Scene

TITLE = "Replay after recovery"
WINDOW = "after_intent:4 (intent recorded, nothing sent), then replay"
STEP = 4
CHECKPOINT_EVERY = "10"


def run(scene: Scene, out: Outcome) -> None:
    doomed = scene.worker(kill_at=f"after_intent:{STEP}",
                          DURABLE_CHECKPOINT_EVERY=CHECKPOINT_EVERY)
    run_id = scene.start()
    out.run_id = run_id
    key = f"{run_id}:{STEP}"
    out.expect("first worker died of SIGKILL", -signal.SIGKILL, doomed.wait(30))
    killed_at = now_ms()
    out.expect("nothing was sent before the crash", [], scene.world.requests(key))
    scene.worker(DURABLE_CHECKPOINT_EVERY=CHECKPOINT_EVERY)
    out.figures["recovery by"] = scene.recovery(DURABLE_CHECKPOINT_EVERY=CHECKPOINT_EVERY).mode
    final = scene.wait(run_id, 30)
    entries, apps = collect(out, scene, run_id, final)
    resumed = first_after(entries, killed_at)
    if resumed is not None:
        out.recovery = recovery_rows(scene, run_id, resumed[0])
    expect_common(out, scene, run_id, apps, state="completed", final=final,
                  api={key: 1}, db={f"{run_id}:3": 1})
    out.expect("lookup said not applied, then one more dispatch", ["not_applied"],
               [e.resolution for e in of_type(entries, ev.ActionReconciled, key=key)])
    check_replay(scene, out, run_id)
    check_redrive(scene, out, run_id, len(entries))


def _same(a: object, b: object) -> bool:
    return bool(msgspec.to_builtins(a) == msgspec.to_builtins(b))


def check_replay(scene: Scene, out: Outcome, run_id: str) -> None:
    elog = scene.client.log
    entries = scene.client.events(run_id)
    events = [e.event for e in entries if e.event is not None]
    whole = fold(events, window=elog.window)
    checkpoints = [e.id for e in entries if isinstance(e.event, ev.Checkpoint)]
    out.figures["events"] = len(entries)
    out.figures["checkpoints"] = len(checkpoints)
    out.expect("the log has a checkpoint to replay from", True, bool(checkpoints))
    from_zero = replay(elog, run_id)
    out.expect("replay from offset 0 == fold", True, _same(from_zero.state, whole))
    out.expect("replay from offset 0 starts at the last checkpoint",
               checkpoints[-1] if checkpoints else "", from_zero.started_from)
    mid = len(entries) // 2
    from_mid = replay(elog, run_id, start=entries[mid].id)
    out.expect("replay from a middle offset == fold", True, _same(from_mid.state, whole))
    out.expect("trajectory from the middle offset == the log's tail", True,
               from_mid.rows == trajectory(entries[mid:]))
    out.figures["middle offset"] = entries[mid].id
    wrong = [entries[i].id for i in range(len(entries))
             if not _same(state_at(elog, run_id, entries[i].id)[0],
                          fold(events[: i + 1], window=elog.window))]
    out.expect("state_at every offset == fold up to it", [], wrong)
    out.expect("client.status (from the checkpoint) == fold", True,
               _same(scene.client.status(run_id), whole))


def check_redrive(scene: Scene, out: Outcome, run_id: str, n_events: int) -> None:
    scene.stop_processes()  # only the re-driving worker may take the job
    before = scene.world.applications(run_id)
    scene.client.enqueue(run_id, force=True)
    burst = scene.worker(burst=True, DURABLE_CHECKPOINT_EVERY=CHECKPOINT_EVERY)
    out.expect("re-driving worker exited cleanly", 0, burst.wait(30))
    after = scene.world.applications(run_id)
    out.expect("re-driving applied nothing new", (before.api, before.db), (after.api, after.db))
    out.expect("re-driving appended nothing", n_events, len(scene.client.events(run_id)))


if __name__ == "__main__":
    from examples.scenarios.runner import main

    sys.exit(main(["replay"]))
