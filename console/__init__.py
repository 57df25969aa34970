"""``durable console``: the operators' web console, a process on top of the library.

Pages are rendered on the server (Starlette, Jinja2), with a little plain JavaScript for the
live parts (server-sent events) and the state slider. Every read and every action goes
through ``durable.client.Client``; actions are POSTs carrying a CSRF token, allowed by the
logged-in user's roles, and recorded in the run's log under the user's name.

Modules: ``users`` (the users file, password hashes, roles), ``auth`` (login, sessions,
CSRF, role checks), ``timeline`` (a run's log as three columns and a steps table),
``pages`` (the GET pages), ``api`` (their JSON twins), ``actions`` (the POSTs), ``live``
(server-sent events), ``app`` (the Starlette application), ``cli`` (the ``durable
console`` command).
"""
