"""The run report as a planner uses it, in headless Chromium driven by Playwright: one small
retry storm's report (docs/planning.md §4) opens offline, logs no error, shows the hot
instance on its first figure, answers a hover with the value under the mouse and a drag
with a zoom, and leaves a screenshot.

Playwright drives Debian's ``chromium`` (its own browser download cannot work here):
``./run-tests.sh`` installs it where apt can (scripts/test-browser.sh); without a browser,
or one that cannot start here, this test skips and says why."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support import PROJECT, SMALL_RETRY_STORM

from retrysim import load_scenario, simulate
from retrysim.reporting import plots
from retrysim.reporting.report import write_run_report

playwright = pytest.importorskip("playwright.sync_api")

BROWSER = next(
    (
        found
        for name in ("chromium", "chromium-browser", "google-chrome")
        if (found := shutil.which(name))
    ),
    None,
)
SCREEN = {"width": 1200, "height": 1080}  # what a planner sees before scrolling
# The first chart's Plotly state, read in the page: each trace's name and values, and the
# pixel position of a point of the Ready backlog (where a mouse hovers it).
_FIRST_CHART = """chart => {
  const gd = chart.querySelector('.plotly-graph-div');
  const ready = gd._fullData.find(t => t.name === 'Ready');
  const ys = Array.from(ready.y), at = ys.indexOf(Math.max(...ys));
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout[ready.yaxis.replace('y', 'yaxis')];
  return {
    traces: gd._fullData.map(t => ({name: t.name, y: Array.from(t.y || [])})),
    ready: ready.y[at],
    px: xa._offset + xa.l2p(ready.x[at]), py: ya._offset + ya.l2p(ready.y[at]),
    box: [xa._offset, ya._offset, xa._length, ya._length],
    range: xa.range.slice(),
  };
}"""


def _rgb(color: str) -> str:
    """A #rrggbb colour as the browser writes it in a style: rgb(r, g, b)."""
    return "rgb({}, {}, {})".format(*(int(color[i : i + 2], 16) for i in (1, 3, 5)))


@pytest.mark.skipif(BROWSER is None, reason="no headless Chromium (scripts/test-browser.sh)")
def test_the_report_is_interactive_offline_and_shows_the_hot_instance_first(spark, tmp_path):
    scenario = load_scenario(PROJECT / "conf" / "retry-storm.yaml", list(SMALL_RETRY_STORM))
    simulate(spark, scenario, output=str(tmp_path), run_id="storm", validate=False)
    page_path = Path(write_run_report(spark, str(tmp_path), "storm"))
    threads = scenario.groups[0].consumers.threads

    with playwright.sync_playwright() as driver:
        try:
            browser = driver.chromium.launch(
                executable_path=BROWSER, args=["--no-sandbox", "--disable-dev-shm-usage"]
            )
        except playwright.Error as error:
            pytest.skip(f"{BROWSER} could not start here: {str(error)[-500:]}")
        try:
            page = browser.new_page(viewport=SCREEN)
            remote: list[str] = []
            errors: list[str] = []

            def only_files(route) -> None:
                if route.request.url.startswith("file://"):
                    route.continue_()
                else:
                    remote.append(route.request.url)
                    route.abort()

            page.route("**/*", only_files)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(page_path.as_uri())
            chart = page.locator(".chart").first
            chart.locator(".main-svg").first.wait_for()
            first = chart.evaluate(_FIRST_CHART)
            page.screenshot(path=str(tmp_path / "report.png"))

            # the hot instance: on the first figure, at its own pool's line, drawn in view
            traces = {trace["name"]: trace["y"] for trace in first["traces"]}
            assert max(traces["instance 0 (busiest)"]) == pytest.approx(threads, rel=0.02)
            others = [y for name, y in traces.items() if name.startswith("instance ") and
                      "busiest" not in name]  # fmt: skip
            assert others and all(max(y) < 0.8 * threads for y in others)
            line = f'path.js-line[style*="stroke: {_rgb(plots.HOT_COLOR)}"]'
            hot = chart.locator(f".cartesianlayer {line}")  # not the legend's sample
            assert hot.count() >= 1
            bottom = hot.first.bounding_box()
            assert bottom["y"] + bottom["height"] <= SCREEN["height"]

            # a hover shows the value under the mouse
            origin = chart.locator(".plotly-graph-div").bounding_box()
            page.mouse.move(origin["x"] + first["px"], origin["y"] + first["py"])
            label = chart.locator(".hoverlayer")
            label.locator("text").first.wait_for()
            assert f"{int(first['ready']):,}" in label.text_content()

            # a drag zooms the time axis
            left, top, width, height = first["box"]
            y = origin["y"] + top + height / 2
            page.mouse.move(origin["x"] + left + width * 0.3, y)
            page.mouse.down()
            page.mouse.move(origin["x"] + left + width * 0.5, y, steps=5)
            page.mouse.up()
            zoomed = chart.evaluate(_FIRST_CHART)["range"]
            assert zoomed[1] - zoomed[0] < 0.5 * (first["range"][1] - first["range"][0])
        finally:
            browser.close()

    assert not remote, f"the report asked the network for {remote}"
    assert not errors, errors
    assert (tmp_path / "report.png").stat().st_size > 10_000
