#!/usr/bin/env bash
# The report's screenshot test renders a run report in headless Chromium
# (tests/reporting/test_screenshot.py). Where Chromium is missing and Debian's apt can install
# it (as root), install it once; otherwise the test skips and says why. Never fails.
command -v chromium >/dev/null 2>&1 && exit 0
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || exit 0
echo "retrysim: installing Debian's chromium for the report's screenshot test (once, ~20 s)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
  || { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends chromium >/dev/null 2>&1; } \
  || echo "retrysim: could not install chromium; the screenshot test will skip" >&2
exit 0
