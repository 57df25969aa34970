"""``durable``: the command line, one module per concern.

- ``runs``: what producers and operators do to runs (start, status, runs, cancel, respond,
  approve, quarantine release).
- ``audit``: reading the evidence (log, replay, verify, export, fork).
- ``admin``: the server and the indexes (redis, repair-index).
- ``main``: the parser, exit codes, and the commands that other packages add through the
  ``durable.commands`` entry point group (the worker, the reconciler, the examples).
"""

from durable.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
