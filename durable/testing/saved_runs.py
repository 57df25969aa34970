"""Saved runs as tests of agent code, as Temporal's replayer runs saved histories: a run
exported with ``durable export RUN --saved -o tests/saved/RUN.jsonl`` replays against the
code imported now with no model, no tool and no Redis (``durable.audit.offline``)::

    import myapp.agents                                  # registers the agents
    from durable.testing import replay_file, saved_run_tests

    def test_the_checkout_run_still_replays() -> None:
        replay_file("tests/saved/checkout-1.jsonl")      # raises, naming the step

    test_saved = saved_run_tests("tests/saved")          # one test per file of the folder

A replay that diverges raises ``SavedRunDiverged`` (a ``NondeterminismError``) naming the
file, the run, the first step that differs and how: the tool, the arguments that differ with
both values, or (a model step) that its request's digest differs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from durable.agents import Agent, Registry, registry
from durable.audit.offline import TIMEOUT_S, Replayed, SavedRunDiverged, load, replay_saved
from durable.security.sealing import Keyring

__all__ = ["SavedRunDiverged", "replay_file", "saved_run_tests", "saved_runs_in"]

#: The names of saved runs in a folder.
PATTERNS = ("*.jsonl", "*.jsonl.gz")


def replay_file(path: Path | str, agent: Agent | None = None, *, tools: Registry = registry,
                keyring: Keyring | None = None, timeout_s: float = TIMEOUT_S) -> Replayed:
    """Replay the saved run at ``path`` against ``agent`` (default: the registered agent it
    names); returns the verdict when the code takes the recorded steps, else raises
    ``SavedRunDiverged``. ``keyring`` opens sealed fields (default: the environment's)."""
    saved = load(path, keyring)
    return replay_saved(saved, agent, tools=tools, timeout_s=timeout_s).check()


def saved_runs_in(folder: Path | str) -> list[Path]:
    """The saved runs of ``folder`` (``.jsonl``, ``.jsonl.gz``), sorted by name."""
    where = Path(folder)
    return sorted({p for pattern in PATTERNS for p in where.glob(pattern)})


def saved_run_tests(folder: Path | str, *, tools: Registry = registry
                    ) -> Callable[[Path], None]:
    """A pytest test function, one test per saved run of ``folder`` (its id: the file's
    name): assign it to a ``test_`` name of a test module. An empty folder is one skipped
    test, saying so."""
    import pytest  # a test helper: pytest is there when it is used

    files = saved_runs_in(folder)
    params = [pytest.param(p, id=p.name) for p in files] or [
        pytest.param(None, marks=pytest.mark.skip(reason=f"no saved run in {folder}"))]

    @pytest.mark.parametrize("saved_run", params)
    def test_saved_run_replays(saved_run: Path) -> None:
        replay_file(saved_run, tools=tools)

    return test_saved_run_replays
