"""The audit: reading a run's evidence back, above the log (``durable.log``).

- ``replay``: the state at any entry of a run's stream, its trajectory, and the
  determinism check that re-decides recorded steps with the agent's code.
- ``forks``: a new run from a prefix of another's, and counterfactual forks that run
  under a changed configuration with every new effect held; ``diff``: two runs'
  trajectories side by side.
- ``offline``: a saved run (a file) replayed against agent code with no model, tool or
  Redis: a test of the code.
- ``verify``: a run's log checked against the invariants the system promises, approvals
  and settles against the approver registry included.
- ``archives``: an archive file of ``durable archive`` checked on its own (entries,
  chain, seal, large values), once the run's keys are gone.
- ``seals``: a terminal run's seal (its log's hash chain head, signed with a key an admin
  registered) checked against the registry; sealing a run after the fact.
- ``deploycheck``: whether new code can still read and drive the runs in flight, before it
  is deployed (``durable deploy check``).

All of them need what the log must not import (the agents, approvals, the approver registry,
settling), which is why they live here and not in ``durable.log``.
"""
