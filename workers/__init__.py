"""The worker process: ``durable worker`` (or ``python -m durable.workers``)."""
