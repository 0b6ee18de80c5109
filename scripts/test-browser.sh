#!/usr/bin/env bash
# The report's browser test opens a run report in headless Chromium through Playwright
# (tests/reporting/test_screenshot.py). Where no Chromium is found and Debian's apt can
# install it (as root), install it, trying once per checkout (a marker in .venv); otherwise
# the test skips and says why. Never fails.
for browser in chromium chromium-browser google-chrome; do
  command -v "$browser" >/dev/null 2>&1 && exit 0
done
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRIED="$ROOT/.venv/.retrysim-chromium-tried"
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ ! -e "$TRIED" ] || exit 0
touch "$TRIED"
echo "retrysim: installing Debian's chromium for the report's screenshot test (once, ~20 s)..." >&2
export DEBIAN_FRONTEND=noninteractive
get_chromium() { timeout 300 apt-get install -y --no-install-recommends chromium >/dev/null 2>&1; }
get_chromium || { timeout 300 apt-get update >/dev/null 2>&1 && get_chromium; } \
  || echo "retrysim: could not install chromium; the screenshot test will skip" >&2
exit 0
