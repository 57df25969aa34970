"""The worker process: ``durable worker`` (or ``python -m workers``)."""
