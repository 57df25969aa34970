"""The examples: agents (``examples.agents``), their external world (``examples.world``),
the scenarios, the demo and the chaos suite. The core never imports this package; its
commands (``durable world``, ``demo``, ``chaos``) reach the CLI through the
``durable.commands`` entry point group."""
