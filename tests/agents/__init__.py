"""The agents and tools of the tests, one module per concern: a worker imports the modules
its ``DURABLE_AGENTS`` names (``tests.agents.basic,tests.agents.streaming``), a test the ones
it starts runs of. Importing a module registers its agents and tools; this package itself
registers nothing, so a worker serves the agents of the modules it was given and no other."""
