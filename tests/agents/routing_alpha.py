"""Agent ``alpha`` alone (``tests.agents.routing``)."""

from tests.agents.routing import define

define("alpha", "tick_a")
