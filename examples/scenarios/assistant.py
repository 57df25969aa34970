"""Scenario ``assistant``: the LLM tool-calling agent, SIGKILLed mid-conversation.

The ``assistant`` agent (``examples.agents.assistant``, ordinary code) talks to the world's
scripted model: step 1 the model asks for ``notify``, step 2 notifies, step 3 the model asks
for ``write``, step 4 writes, step 5 the model answers. Window ``after_effect:3``: the
model has answered step 3 (the world counted the request under its key), the worker dies
before the reply is in the log. A fresh worker runs the function again from the top: steps
1 and 2 return their recorded results without being sent (the model is not asked again,
nobody is notified again), step 3 — the call in flight, effect-free — is sent again at
once with the same key, and the run goes on to the end.

Checked: every recorded model call was requested once, the one in flight at the kill at
most twice; the notification API and the database applied each key once; ``verify``.

Run it on its own: ``python -m examples.scenarios.assistant``.
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

TITLE = "Assistant killed mid-conversation"
WINDOW = "after_effect:3 (model answered, reply not recorded)"
#: The second model call: the one that asks for ``write``.
STEP = 3
#: The steps the scripted conversation takes: chat, notify, chat, write, chat.
MODEL_STEPS, NOTIFY_STEP, WRITE_STEP = (1, 3, 5), 2, 4
INPUT = {"task": "Tell ops@example.com that the nightly orders report is ready, and "
                 "record it."}


def run(scene: Scene, out: Outcome) -> None:
    doomed = scene.worker(kill_at=f"after_effect:{STEP}")
    run_id = scene.start(INPUT, agent="assistant")
    out.run_id = run_id
    key = f"{run_id}:{STEP}"
    code = doomed.wait(30)
    killed_at = now_ms()
    out.expect("first worker died of SIGKILL", -signal.SIGKILL, code)
    at_kill = scene.world.applications(run_id)
    out.expect("the model answered the call in flight before the crash (requests)", 1,
               at_kill.model.get(key, 0))
    out.expect("notified before the crash (step 2)", {f"{run_id}:{NOTIFY_STEP}": 1},
               at_kill.api)
    ledger = (scene.client.redis.hget(scene.client.log.keys.ledger(run_id), key) or b"").decode()
    out.expect("ledger: key claimed, no outcome", "claimed", ledger.split("|")[0])
    before = scene.client.status(run_id)
    out.expect("run left without the reply", "dispatched", before.actions[STEP].status)
    recorded = [f"{run_id}:{s}" for s in MODEL_STEPS
                if s in before.actions and before.actions[s].status == "succeeded"]

    final, entries, apps = recover(out, scene, run_id, killed_at)
    model_keys = [f"{run_id}:{s}" for s in MODEL_STEPS]
    requests = {k: apps.model.get(k, 0) for k in model_keys}
    out.figures["model calls"] = final.model_calls
    out.figures["model requests"] = sum(apps.model.values())
    out.figures["tokens"] = final.tokens
    expect_common(out, scene, run_id, apps, state="completed", final=final,
                  api={f"{run_id}:{NOTIFY_STEP}": 1}, db={f"{run_id}:{WRITE_STEP}": 1})
    out.expect("recorded model calls before the kill", [f"{run_id}:1"], recorded)
    out.expect("model calls recorded before the kill, requested again", {},
               {k: requests[k] for k in recorded if requests[k] != 1})
    out.expect("model requests per key (in flight at the kill: at most 2)",
               {model_keys[0]: 1, key: 2, model_keys[2]: 1}, requests)
    out.expect("requests to the model without a step's key", {},
               {k: n for k, n in apps.model.items() if k not in model_keys})
    out.expect("model requests sent counted (the one in flight twice), tokens counted",
               (4, True), (final.model_calls, final.tokens > 0))
    out.expect("the call in flight sent again at once (effect-free, no lookup)",
               ["not_applied"],
               [e.resolution for e in of_type(entries, ev.ActionReconciled, key=key)])
    out.expect("dispatches per step (recorded steps are not sent again)",
               {1: 1, 2: 1, 3: 2, 4: 1, 5: 1},
               {e.step: len(of_type(entries, ev.ActionDispatched, step=e.step))
                for e in of_type(entries, ev.StepDecided)})
    out.expect("model requests logged as digests", True,
               all(set(e.args) == {"_digest", "_bytes"}
                   for e in of_type(entries, ev.StepDecided, tool="chat")))
    result = final.result if isinstance(final.result, dict) else {}
    out.expect("the model's answer is the result", (True, ["notify", "write"]),
               (str(result.get("answer", "")).startswith("Done:"), result.get("tools_called")))
    owners = {e.owner for e in of_type(entries, ev.LeaseAcquired)}
    out.expect("a second worker took over", True, len(owners) >= 2)


if __name__ == "__main__":
    from examples.scenarios.runner import main

    sys.exit(main(["assistant"]))
