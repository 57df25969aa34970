"""``durable a2a``: the A2A front door, a process on top of the library.

Another agent calls a published agent over the Agent2Agent protocol: a task is a run. The
protocol itself (JSON-RPC parsing, its error objects, server-sent events, the v0.3 method
names beside v1.0's, agent card serialization) is the official ``a2a-sdk``'s; what is here
maps it onto runs, through ``durable.client.Client`` only.

Who calls (bearer tokens per tenant, the console's users) is the library's
``durable.security.callers``, for the door ``a2a``. Modules: ``cards`` (an agent card
per published agent, its skill from the input schema), ``discovery`` (the host's card, each
card in the shape of the protocol version asked for, caching headers), ``params`` (what a
request's parameters must be), ``messages`` (an A2A message as a run's input or a wait's
answer, and its limits), ``tasks`` (a run as an A2A task, its log as task events),
``listing`` (ListTasks: order, filters, page tokens), ``push`` (push notifications: configs
in Redis, the SDK's sender, signed bodies), ``handler`` (the SDK's ``RequestHandler`` over
the client), ``app`` (the Starlette application: cards, one JSON-RPC endpoint per agent),
``cli`` (the ``durable a2a`` command).
"""
