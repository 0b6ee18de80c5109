"""A scenario's group on a real broker, its metrics scraped by a real Prometheus as a user's
would be, and written as the range query a user exports (``metrics.json``).

The broker4 harness, given ``metrics=true``, serves the RocketMQ exporter's 4.x series
(``rocketmq_producer_tps``, ``rocketmq_group_diff``, ``rocketmq_topic_dlq_offset``...),
computed on each scrape from the 4.9.7 broker's own statistics through the admin calls and
formulas of apache/rocketmq-exporter, which Maven Central does not carry (jvm/broker4's
``Exporter``; docs/conformance.md). A harness writes each endpoint it serves to
``out/metrics-endpoints.txt`` as ``name url`` lines as soon as it is up; :func:`record_metrics`
scrapes every one of them, so it serves any harness that does.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from retrysim.conformance.harness import BrokerRun, HarnessError, run_on_broker
from retrysim.metrics.prometheus import Prometheus
from retrysim.scenario.spec import Scenario

ENDPOINTS = "metrics-endpoints.txt"  # in the harness's out/ folder
SCRAPE_INTERVAL_S = 2.0
# the scrapes the harness still answers after its run, so that the last ones see the end
LINGER_SCRAPES = 1.5


@dataclass(frozen=True)
class MetricsRun:
    """The broker's run and its metrics: ``metrics`` holds the range query of every
    ``rocketmq_`` series over ``[start, end]`` (seconds since the epoch) at ``step``."""

    run: BrokerRun
    metrics: Path
    endpoints: dict[str, str]
    start: float
    end: float
    step: float


def endpoints(path: Path) -> dict[str, str]:
    """A harness's ``name url`` lines: URL by name."""
    pairs = (line.split() for line in path.read_text().splitlines() if line.strip())
    return {name: url for name, url in pairs}


def record_metrics(
    scenario: Scenario,
    name: str,
    folder: str | Path,
    scrape_interval_s: float = SCRAPE_INTERVAL_S,
) -> MetricsRun:
    """Run the scenario's group ``name`` on its real broker with metrics on, a Prometheus
    scraping every endpoint the harness serves every ``scrape_interval_s`` from when they are
    up to the harness's end; then write ``folder/metrics.json``, the range query over that
    span at step ``scrape_interval_s``."""
    folder = Path(folder)
    listed = folder / "out" / ENDPOINTS
    listed.unlink(missing_ok=True)
    linger_ms = int(LINGER_SCRAPES * scrape_interval_s * 1000)
    settings = {"metrics": "true", "metrics_linger_ms": str(linger_ms)}
    done: dict[str, object] = {}

    def run() -> None:
        try:
            done["run"] = run_on_broker(scenario, name, folder, settings=settings)
        except BaseException as error:  # handed over to the caller's thread
            done["error"] = error

    harness = threading.Thread(target=run, name="retrysim-broker", daemon=True)
    harness.start()
    while not listed.exists() and harness.is_alive():
        time.sleep(0.05)
    if not listed.exists():
        harness.join()
        _raise_failure(done)
        raise HarnessError(f"the harness served no metrics (no out/{ENDPOINTS})")
    served = endpoints(listed)
    with Prometheus(folder / "prometheus", list(served.values()), scrape_interval_s) as server:
        start = time.time()
        harness.join()
        end = time.time()
        _raise_failure(done)
        path = server.record(folder / "metrics.json", start, end, scrape_interval_s)
    return MetricsRun(done["run"], path, served, start, end, scrape_interval_s)  # type: ignore[arg-type]


def _raise_failure(done: dict[str, object]) -> None:
    """The harness thread's exception, raised in the caller's thread."""
    error = done.get("error")
    if isinstance(error, BaseException):
        raise error
