"""Example agents. Importing this package registers them (``DURABLE_AGENTS`` default)."""

from durable.examples import approval, basic, pipeline  # noqa: F401
