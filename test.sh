#!/usr/bin/env bash
# Runs the whole test suite: installs what it needs into .venv, then lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
.venv/bin/ruff check durable workers reconciler console examples tests bench
.venv/bin/mypy durable workers reconciler console examples
.venv/bin/python -m pytest -q "$@"
# The tests marked `cluster` again, on a real 3-master Redis Cluster (README, "Scaling out").
exec .venv/bin/python -m pytest -q --cluster "$@"
