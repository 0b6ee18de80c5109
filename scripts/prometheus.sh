#!/usr/bin/env bash
# The tests marked prometheus start a real Prometheus on loopback: on a run's OpenMetrics
# export backfilled with promtool (tests/metrics/test_export.py), or scraping a real broker's
# metrics (tests/metrics/test_broker_calibration.py, tests/conformance/test_exporter4.py).
# Where prometheus or promtool is missing, Debian's package is installed where apt can.
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 && exit 0
exec "$(dirname "${BASH_SOURCE[0]}")/apt-once.sh" prometheus "the Prometheus tests"
