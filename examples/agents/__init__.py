"""Example agents. Importing this package registers them (``DURABLE_AGENTS`` default)."""

from examples.agents import approval, assistant, basic, pipeline  # noqa: F401
