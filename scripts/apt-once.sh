#!/usr/bin/env bash
# apt-once.sh PACKAGE TESTS: install Debian's PACKAGE for TESTS where apt can (as root),
# trying once per checkout (a marker in .venv); otherwise those tests skip and say why.
# Never fails. scripts/test-browser.sh and scripts/prometheus.sh call it.
PACKAGE="$1" TESTS="$2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRIED="$ROOT/.venv/.retrysim-$PACKAGE-tried"
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ ! -e "$TRIED" ] || exit 0
touch "$TRIED"
echo "retrysim: installing Debian's $PACKAGE for $TESTS (once, ~30 s)..." >&2
export DEBIAN_FRONTEND=noninteractive
get() { timeout 300 apt-get install -y --no-install-recommends "$PACKAGE" >/dev/null 2>&1; }
get || { timeout 300 apt-get update >/dev/null 2>&1 && get; } \
  || echo "retrysim: could not install $PACKAGE; $TESTS will skip" >&2
exit 0
