"""Agent ``beta`` alone (``tests.routing_agents``)."""

from tests.routing_agents import define

define("beta", "tick_b")
