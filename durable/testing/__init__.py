"""Helpers for testing agents and deployments against real parts, as ``temporalio.testing``
does for Temporal: an in-process environment that runs one agent or one tool on a real
Redis server with a clock the test moves (``AgentEnvironment``, ``TestClock``); a real
Redis server on a random port (``Server``), real worker and reconciler processes
(``Worker``, ``Reconciler``), and fault injection at the step loop's named crash windows
(``Worker(url, kill_at="after_effect:2")``, ``faults.KillAt``), and an admin key for an
approver registry (``AdminKey``); saved runs replayed offline as tests of agent code
(``replay_file``, ``saved_run_tests``: ``durable.testing.saved_runs``).
``durable.testing.provider`` is a local HTTP "provider"
with quotas (and agents that call it), for flow-control tests; import it by name (it
registers its agents)."""

from durable.testing.admin import AdminKey
from durable.testing.environment import AgentEnvironment, TestClock, ToolOutcome
from durable.testing.faults import KillAt
from durable.testing.processes import Reconciler, Worker, env_for, wait_for
from durable.testing.saved_runs import SavedRunDiverged, replay_file, saved_run_tests
from durable.testing.server import Server

__all__ = ["AdminKey", "AgentEnvironment", "KillAt", "Reconciler", "SavedRunDiverged",
           "Server", "TestClock", "ToolOutcome", "Worker", "env_for", "replay_file",
           "saved_run_tests", "wait_for"]
