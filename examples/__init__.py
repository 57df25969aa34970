"""The examples: agents (``examples.agents``), their external world (``examples.world``),
the scenarios, the demo and the chaos suite. The core never imports this package, and the
wheel does not hold it: it runs from a checkout, ``python -m examples world|demo|chaos``
(``examples.cli``), and its agents load with ``DURABLE_AGENTS=examples.agents`` when the
repository's root is on the path (``python -m durable ...`` from it, or ``PYTHONPATH=.``)."""
