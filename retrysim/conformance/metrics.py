"""A scenario's group on the 5.x broker, its metrics scraped over the run by a real
Prometheus and stored as the HTTP API's range-query JSON: what a user exports from a
production Prometheus, for ``retrysim calibrate`` (docs/conformance.md, *Metrics*).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from retrysim.conformance.harness import group_spec, run_on_broker
from retrysim.metrics.prometheus import Prometheus
from retrysim.scenario.spec import Scenario

METRICS_JSON = "metrics.json"


def record_broker_metrics(
    scenario: Scenario, group_name: str, folder: str | Path, scrape_interval_s: float = 5.0
) -> Path:
    """Run the group ``group_name`` on the 5.x harness with its metrics on, scraped every
    ``scrape_interval_s`` by a Prometheus started before production, and write
    ``folder/metrics.json``: every ``rocketmq_`` series over the run's span (production's
    start, t0, to the horizon) at a step of the scrape interval. The broker's files go to
    ``folder/broker``, the server's to ``folder/prometheus``."""
    folder = Path(folder)
    _, spec = group_spec(scenario, group_name)
    with contextlib.ExitStack() as stack:
        servers: list[Prometheus] = []

        def scrape(endpoints: dict[str, str]) -> None:
            server = stack.enter_context(
                Prometheus(folder / "prometheus", list(endpoints.values()), scrape_interval_s)
            )
            servers.append(server)
            server.wait_for_scrapes(1)  # production starts once every endpoint answered

        run = run_on_broker(scenario, group_name, folder / "broker", metrics=scrape)
        start = run.t0_ms / 1000
        end = start + spec.horizon_ms / 1000
        return servers[0].record(folder / METRICS_JSON, start, end, scrape_interval_s)
