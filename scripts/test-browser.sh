#!/usr/bin/env bash
# The report's browser test opens a run report in headless Chromium through Playwright
# (tests/reporting/test_screenshot.py). Where no Chromium is found, Debian's is installed
# where apt can; otherwise the test skips and says why. Never fails.
for browser in chromium chromium-browser google-chrome; do
  command -v "$browser" >/dev/null 2>&1 && exit 0
done
exec "$(dirname "${BASH_SOURCE[0]}")/apt-once.sh" chromium "the report's screenshot test"
