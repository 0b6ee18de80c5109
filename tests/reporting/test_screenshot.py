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
from support import PROJECT, SMALL_RETRY_STORM

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


def screenshot(page: Path, png: Path, width: int = 1200, height: int = 2200) -> np.ndarray:
    """``page`` as headless Chromium draws it (RGB pixels). The flags keep it from reaching
    for the network, which this machine closes, and from a small /dev/shm; a browser that
    cannot start here skips the test (an environment's limit, not the report's)."""
    command = [
        BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage",
        f"--user-data-dir={png.parent / 'chromium-profile'}", "--hide-scrollbars",
        "--force-device-scale-factor=1", f"--window-size={width},{height}",
        f"--screenshot={png}", page.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0 or not png.is_file():
        pytest.skip(f"{BROWSER} could not take a screenshot here: {done.stderr[-500:]}")
    return np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)


def first_band(image: np.ndarray, color: tuple[int, int, int], gap: int = 60) -> np.ndarray:
    """The rows of the first figure that shows ``color`` (its rows, and gaps of at most
    ``gap`` between them: one figure's axes), for checks that no later figure can pass."""
    rows = np.flatnonzero((np.abs(image - np.array(color)).max(axis=2) <= 1).any(axis=1))
    assert len(rows), "no figure shows the colour"
    end = rows[0]
    for row in rows[1:]:
        if row - end > gap:
            break
        end = row
    return image[rows[0] : end + 1]


def pixels_of(image: np.ndarray, color: str | tuple[int, int, int], tolerance: int = 2) -> int:
    rgb = np.array(Image.new("RGB", (1, 1), color).getpixel((0, 0)) if isinstance(color, str)
                   else color)  # fmt: skip
    return int((np.abs(image - rgb).max(axis=2) <= tolerance).sum())


def _over_white(color: str, alpha: float) -> tuple[int, int, int]:
    rgb = np.array(Image.new("RGB", (1, 1), color).getpixel((0, 0)))
    return tuple(np.rint(255 - alpha * (255 - rgb)).astype(int))


@pytest.mark.skipif(BROWSER is None, reason="no headless Chromium (scripts/test-browser.sh)")
def test_the_reports_screenshot_shows_the_storm_the_pool_and_the_outage(spark, tmp_path):
    scenario = load_scenario(PROJECT / "conf" / "retry-storm.yaml", list(SMALL_RETRY_STORM))
    simulate(spark, scenario, output=str(tmp_path), run_id="storm", validate=False)
    page = Path(write_run_report(spark, str(tmp_path), "storm"))

    image = screenshot(page, tmp_path / "report.png")

    assert image.shape[1] == 1200
    assert (image == 255).all(axis=2).mean() > 0.5  # a page, mostly white, not an error
    # the first figure with the outage shaded behind it: state counts over time ...
    outage = _over_white(plots.COLORS["Ready"], 0.08)
    figure = first_band(image, outage)
    assert pixels_of(figure, outage, tolerance=1) > 5000 and len(figure) > 300  # three axes
    # ... the storm as the lines of the backlogs ...
    assert pixels_of(figure, plots.COLORS["Ready"], tolerance=10) > 200
    assert pixels_of(figure, plots.COLORS["WaitingRetry"], tolerance=10) > 200
    # ... and Inflight against the pool's dotted line across the plot (anti-aliased over two
    # rows of pixels: a lighter shade; the legend's sample alone is a few dozen)
    assert pixels_of(figure, plots.POOL_COLOR, tolerance=40) > 200
