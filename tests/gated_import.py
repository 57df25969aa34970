"""A module a worker imports with its agents (``DURABLE_AGENTS``) that holds the worker in
its start-up until a test lets it go on: a worker imports its agents after it connected to
Redis and before it publishes them (``workers.runtime``), so a test can act in between.

``TEST_IMPORT_MARK``: a file the import creates when it begins (the worker has connected).
``TEST_IMPORT_GATE``: a file the import then waits for, up to ``WAIT_S``. It registers
nothing itself."""

from __future__ import annotations

import os
import time
from pathlib import Path

#: Longest the import waits for its gate: a test that never opens it still ends.
WAIT_S = 60.0


def _hold() -> None:
    mark, gate = os.environ.get("TEST_IMPORT_MARK"), os.environ.get("TEST_IMPORT_GATE")
    if mark:
        Path(mark).touch()
    if not gate:
        return
    end = time.monotonic() + WAIT_S
    while not Path(gate).exists() and time.monotonic() < end:
        time.sleep(0.01)


_hold()
