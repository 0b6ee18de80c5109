#!/usr/bin/env bash
# The export's Prometheus tests backfill a run's OpenMetrics export with promtool and query
# it from a real Prometheus on loopback (tests/metrics/test_export.py, marked prometheus).
# Where prometheus or promtool is missing and Debian's apt can install them (as root),
# install Debian's prometheus package, trying once per checkout (a marker in .venv);
# otherwise those tests skip and say why. Never fails.
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 && exit 0
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRIED="$ROOT/.venv/.retrysim-prometheus-tried"
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ ! -e "$TRIED" ] || exit 0
touch "$TRIED"
echo "retrysim: installing Debian's prometheus for the export's Prometheus tests (once, ~30 s)..." >&2
export DEBIAN_FRONTEND=noninteractive
get_prometheus() {
  timeout 300 apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1
}
get_prometheus || { timeout 300 apt-get update >/dev/null 2>&1 && get_prometheus; } \
  || echo "retrysim: could not install prometheus; the export's Prometheus tests will skip" >&2
exit 0
