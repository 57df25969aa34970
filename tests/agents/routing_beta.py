"""Agent ``beta`` alone (``tests.agents.routing``)."""

from tests.agents.routing import define

define("beta", "tick_b")
