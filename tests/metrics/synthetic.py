"""A broker's metrics drawn from a known truth, as Prometheus and Grafana export them: what
the fits must recover (no Spark, no broker; the real broker's are tests/metrics' broker
tests)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from retrysim.metrics.names import PROCESS_TIME_BUCKETS_MS

T0 = 1_795_000_000.0  # 2026-11-18T...Z: the first sample
STEP = 15.0
Z99 = 2.3263478740408408


@dataclass(frozen=True)
class Truth:
    """Arrivals per second by piece (until s, rate), a baseline and an outage failure
    probability with its edges (s since T0), a lognormal processing time and the pool."""

    pieces: tuple[tuple[float, float], ...] = ((600, 20.0), (1200, 60.0), (1800, 20.0))
    fail: float = 0.05
    outage: tuple[float, float] = (727.5, 1042.5)
    outage_fail: float = 0.6
    mean_ms: float = 30.0
    p99_ms: float = 120.0
    threads: int = 8
    group: str = "payments"
    topic: str = "orders"


def _sigma(mean: float, p99: float) -> tuple[float, float]:
    grid = np.linspace(1e-4, 2.0, 200_001)
    sigma = grid[np.argmin(np.abs(Z99 * grid - grid * grid / 2 - math.log(p99 / mean)))]
    return math.log(mean) - sigma * sigma / 2, float(sigma)


def series(truth: Truth, seed: int = 7) -> list[dict]:
    """The 5.x series of ``truth`` at 15-second samples, as a range query's result list."""
    rng = np.random.default_rng(seed)
    span = truth.pieces[-1][0]
    times = T0 + np.arange(0, span + STEP, STEP)
    mid = times[1:] - T0 - STEP / 2
    rate = np.select([mid < until for until, _ in truth.pieces], [r for _, r in truth.pieces])
    arrivals = rng.poisson(rate * STEP)
    lo, hi = truth.outage
    opened = np.clip((np.minimum(mid + STEP / 2, hi) - np.maximum(mid - STEP / 2, lo)) / STEP, 0, 1)
    p = truth.fail + (truth.outage_fail - truth.fail) * opened
    failed = rng.binomial(arrivals, p)
    retries = np.concatenate([[0], failed[:-1]])
    deliveries = arrivals + retries
    failed_all = failed + rng.binomial(retries, p)
    mu, sigma = _sigma(truth.mean_ms, truth.p99_ms)
    labels = {"topic": truth.topic, "consumer_group": truth.group}
    result = [
        _counter("rocketmq_messages_in_total", {"topic": truth.topic}, times, arrivals),
        _counter("rocketmq_messages_out_total", labels | {"is_retry": "false"}, times, arrivals),
        _counter("rocketmq_messages_out_total", labels | {"is_retry": "true"}, times, retries),
        _gauge("rocketmq_consumer_lag_messages", labels, times, rng.poisson(5, len(times))),
    ]
    busy_ms = np.zeros(len(arrivals))
    for status, counts in (("success", deliveries - failed_all), ("failure", failed_all)):
        drawn = [np.exp(rng.normal(mu, sigma, n)) for n in counts]
        busy_ms += np.array([d.sum() for d in drawn])
        for bound in (*PROCESS_TIME_BUCKETS_MS, math.inf):
            within = [int((d <= bound).sum()) for d in drawn]
            le = "+Inf" if math.isinf(bound) else f"{bound:g}"
            result.append(_counter("rocketmq_process_time_milliseconds_bucket",
                                   labels | {"invocation_status": status, "le": le}, times,
                                   np.asarray(within)))  # fmt: skip
    result.append(_counter("rocketmq_process_time_milliseconds_sum", labels, times, busy_ms))
    return result


def _counter(name: str, labels: dict, times: np.ndarray, increments: np.ndarray) -> dict:
    values = np.concatenate([[1000.0], 1000.0 + np.cumsum(increments)])
    pairs = [[float(t), f"{v:g}"] for t, v in zip(times, values, strict=True)]
    return {"metric": {"__name__": name, **labels}, "values": pairs}


def _gauge(name: str, labels: dict, times: np.ndarray, values: np.ndarray) -> dict:
    return {"metric": {"__name__": name, **labels},
            "values": [[float(t), str(v)] for t, v in zip(times, values, strict=True)]}  # fmt: skip


def write_json(path: Path, result: list[dict]) -> Path:
    path.write_text(json.dumps({"status": "success",
                                "data": {"resultType": "matrix", "result": result}}))  # fmt: skip
    return path


def write_grafana_csv(path: Path, result: list[dict]) -> Path:
    """Grafana's table-view CSV: the time first, a column per series named by its selector."""
    columns = {}
    for item in result:
        labels = dict(item["metric"])
        name = labels.pop("__name__")
        selector = name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
        columns[selector] = {t: v for t, v in item["values"]}
    frame = pd.DataFrame(columns).sort_index()
    frame.index = pd.to_datetime(frame.index, unit="s").strftime("%Y-%m-%d %H:%M:%S")
    frame.index.name = "Time"
    frame.to_csv(path)
    return path
