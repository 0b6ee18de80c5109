"""A scenario's group on a real broker, its metrics scraped over the run by a real
Prometheus and stored as the HTTP API's range-query JSON: what a user exports from a
production Prometheus, for ``retrysim calibrate`` (docs/conformance.md, *Metrics*).

The 5.x harness turns on the broker's own Prometheus exporter and serves the client's
process-time histogram; the 4.x harness serves the RocketMQ exporter's series, computed as
the exporter computes them from the 4.9.7 broker's statistics (Maven Central does not carry
the exporter). Either writes its endpoints once they are up and waits for the scraper before
production begins, so the series cover the run from t0.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from retrysim.conformance.harness import BrokerRun, group_spec, harness_of, run_on_broker
from retrysim.metrics.prometheus import Prometheus
from retrysim.scenario.spec import Scenario

METRICS_JSON = "metrics.json"
# the scrapes the 4.x harness still answers after its horizon, so that the last sees the end
# (the 5.x harness reads the store back for longer than that)
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


def record_broker_metrics(
    scenario: Scenario, group_name: str, folder: str | Path, scrape_interval_s: float = 5.0
) -> MetricsRun:
    """Run the group ``group_name`` on its harness with metrics on, scraped every
    ``scrape_interval_s`` by a Prometheus started before production, and write
    ``folder/metrics.json``: every ``rocketmq_`` series over the run's span (production's
    start, t0, to the horizon) at a step of the scrape interval. The broker's files go to
    ``folder/broker``, the server's to ``folder/prometheus``."""
    folder = Path(folder)
    group, spec = group_spec(scenario, group_name)
    linger_ms = int(LINGER_SCRAPES * scrape_interval_s * 1000)
    settings = {"metrics_linger_ms": str(linger_ms)} if harness_of(group) == "broker4" else {}
    with contextlib.ExitStack() as stack:
        servers: list[Prometheus] = []
        served: dict[str, str] = {}

        def scrape(endpoints: dict[str, str]) -> None:
            server = stack.enter_context(
                Prometheus(folder / "prometheus", list(endpoints.values()), scrape_interval_s)
            )
            servers.append(server)
            served.update(endpoints)
            server.wait_for_scrapes(1)  # production starts once every endpoint answered

        run = run_on_broker(
            scenario, group_name, folder / "broker", metrics=scrape, settings=settings
        )
        start = run.t0_ms / 1000
        end = start + spec.horizon_ms / 1000
        path = servers[0].record(folder / METRICS_JSON, start, end, scrape_interval_s)
        return MetricsRun(run, path, served, start, end, scrape_interval_s)
