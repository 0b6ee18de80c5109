"""The run report as a planner sees it: rendered by headless Chromium, its screenshot shows
the storm, the pool's line and the shaded outage (docs/planning.md §4).

The report is one HTML file with its plots inlined as PNG; a browser that cannot show them
(a broken data URI, an image the page hides or squeezes) shows none of the colours below.
``./run-tests.sh`` installs Debian's chromium where apt can (scripts/test-browser.sh);
without a browser this test skips and says so."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support import PROJECT

from retrysim import load_scenario, simulate
from retrysim.reporting import plots
from retrysim.reporting.report import write_run_report

BROWSER = next(
    (
        found
        for name in ("chromium", "chromium-browser", "google-chrome")
        if (found := shutil.which(name))
    ),
    None,
)
# conf/retry-storm.yaml, small: every retry comes back on instance 0's one retry queue
STORM = [
    "groups.0.workload.messages=1500",
    "groups.0.workload.over=5m",
    "groups.0.behavior.outages.0.start=1m",
    "groups.0.behavior.outages.0.end=3m",
    "groups.0.consumers.threads=2",
    "horizon=1h",
]


def screenshot(page: Path, png: Path, width: int = 1200, height: int = 2200) -> np.ndarray:
    """``page`` as headless Chromium draws it (RGB pixels). The flags keep it from reaching
    for the network, which this machine closes."""
    command = [
        BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", f"--user-data-dir={png.parent / 'chromium-profile'}",
        "--hide-scrollbars", "--force-device-scale-factor=1", f"--window-size={width},{height}",
        f"--screenshot={png}", page.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and png.is_file(), done.stderr[-2000:]
    return np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)


def pixels_of(image: np.ndarray, color: str | tuple[int, int, int], tolerance: int = 2) -> int:
    rgb = np.array(Image.new("RGB", (1, 1), color).getpixel((0, 0)) if isinstance(color, str)
                   else color)  # fmt: skip
    return int((np.abs(image - rgb).max(axis=2) <= tolerance).sum())


def _over_white(color: str, alpha: float) -> tuple[int, int, int]:
    rgb = np.array(Image.new("RGB", (1, 1), color).getpixel((0, 0)))
    return tuple(np.rint(255 - alpha * (255 - rgb)).astype(int))


@pytest.mark.skipif(BROWSER is None, reason="no headless Chromium (scripts/test-browser.sh)")
def test_the_reports_screenshot_shows_the_storm_the_pool_and_the_outage(spark, tmp_path):
    scenario = load_scenario(PROJECT / "conf" / "retry-storm.yaml", STORM)
    simulate(spark, scenario, output=str(tmp_path), run_id="storm", validate=False)
    page = Path(write_run_report(spark, str(tmp_path), "storm"))

    image = screenshot(page, tmp_path / "report.png")

    assert image.shape[:2] == (2200, 1200)
    assert (image == 255).all(axis=2).mean() > 0.5  # a page, mostly white, not an error
    # the first figure, state counts over time: the storm as lines of the backlogs ...
    assert pixels_of(image, plots.COLORS["Ready"], tolerance=10) > 200
    assert pixels_of(image, plots.COLORS["WaitingRetry"], tolerance=10) > 200
    # ... Inflight against the pool's dotted line across the plot (anti-aliased over two
    # rows of pixels: a lighter shade; the legend's sample alone is a few dozen) ...
    assert pixels_of(image, plots.POOL_COLOR, tolerance=40) > 200
    # ... and the outage shaded behind them all
    assert pixels_of(image, _over_white(plots.COLORS["Ready"], 0.08), tolerance=1) > 5000
