"""What the system says about itself, read from Redis, never from a process's memory.

- ``metrics``: the shared Prometheus collector (``durable metrics``) over the indexes;
- ``tracing``: spans of runs and steps, the producer's trace carried to the workers
  (optional: the ``otel`` extra);
- ``overview``: what operators look at across runs: counts per state, the leases held,
  the worker processes, the queue's depth, the reconcilers' last sweeps;
- ``liveness``: the workers' liveness keys (a dead worker's runs resume within a second),
  and the agents each one serves.
"""
