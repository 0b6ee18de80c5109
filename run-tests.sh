#!/usr/bin/env bash
# The test command: bootstraps .venv on first use, then runs the whole suite.
# Extra arguments go to pytest (e.g. ./run-tests.sh -k timelines).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$ROOT/scripts/bootstrap.sh"
"$ROOT/scripts/delta-jars.sh" >/dev/null  # the Delta Lake JARs, fetched once (build/jars)
"$ROOT/scripts/class-archive.sh" >/dev/null || true  # the launcher's faster JVM start, for the tests that launch it
"$ROOT/scripts/test-browser.sh"  # headless Chromium for the report's screenshot test, where apt can
"$ROOT/scripts/prometheus.sh"  # Prometheus and promtool for the tests marked prometheus, where apt can
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
