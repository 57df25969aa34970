"""``durable console``: the operators' web console, a process on top of the library.

Pages are rendered on the server (Starlette, Jinja2), with a little plain JavaScript for the
live parts (server-sent events) and the state slider. Every read and every action goes
through ``durable.client.Client``; actions are POSTs carrying a CSRF token, allowed by the
logged-in user's roles, and recorded in the run's log under the user's name.

Modules: ``users`` (the users file, password hashes, roles), ``auth`` (who is asking,
CSRF, role checks), ``login`` (logging in behind a rate limit, logging out),
``middleware`` (sessions kept in Redis, security headers), ``timeline`` (a run's log as
three columns and a steps table, with times), ``status`` (what is derived beside the log:
who holds a run, whether a worker is busy), ``pages`` (the GET pages), ``api`` (their
JSON twins), ``actions`` (the POSTs), ``live`` (server-sent events), ``app`` (the
Starlette application), ``cli`` (the ``durable console`` command).
"""
