"""Running scenarios: one at a time, each in its own scene, failures caught and reported.

``python -m examples.scenarios [NAME ...]`` runs the named ones (all seven by default)
against a fresh embedded Redis and world; ``python -m examples.scenarios.<name>`` runs one.
Exit status 0 only when every scenario passed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Sequence
from types import ModuleType

from durable.audit.replay import trajectory
from examples.scenarios.outcome import Outcome
from examples.scenarios.stack import Stack

NAMES = ("normal", "crash", "timeout", "cancel", "replay", "approval", "assistant")


def load(name: str) -> ModuleType:
    if name not in NAMES:
        raise ValueError(f"no scenario {name!r} (known: {', '.join(NAMES)})")
    return importlib.import_module(f"examples.scenarios.{name}")


def run_one(stack: Stack, name: str) -> Outcome:
    """Run one scenario; never raises for a failure of the system under test."""
    module = load(name)
    out = Outcome(name, module.TITLE, module.WINDOW)
    with stack.scene(name) as scene:
        try:
            module.run(scene, out)
        except Exception as exc:
            out.error = f"{type(exc).__name__}: {exc}"
            if out.run_id and not out.timeline:
                try:
                    out.timeline = trajectory(scene.client.events(out.run_id))
                    out.state = scene.client.status(out.run_id).state
                except Exception as again:  # the evidence itself is unreadable
                    out.error += f" (and its log: {again!r})"
    out.seconds = round(time.monotonic() - out.started, 2)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.scenarios", description=__doc__)
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"scenarios to run ({', '.join(NAMES)}; default: all)")
    p.add_argument("--json", action="store_true", help="one JSON object per scenario")
    p.add_argument("--redis-url", default=None, help="use this Redis (default: embedded)")
    args = p.parse_args(argv)
    names = args.names or list(NAMES)
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    outcomes = []
    with Stack.up(args.redis_url) as stack:
        for name in names:
            out = run_one(stack, name)
            outcomes.append(out)
            if args.json:
                print(json.dumps(out.to_json(), default=str), flush=True)
            else:
                from examples.scenarios.render import console, render

                render(console(), out)
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
