"""Agent ``alpha`` alone (``tests.routing_agents``)."""

from tests.routing_agents import define

define("alpha", "tick_a")
