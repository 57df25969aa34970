"""The reconciler process: ``durable reconciler`` (or ``python -m durable.reconciler``)."""
