"""Production metrics from a real broker, end to end: conf/metrics/incident-5x.yaml runs on
the 5.x harness (RocketMQ 5.5.0) with the broker's Prometheus metrics and the client's
process-time histogram scraped every 2 s by a real Prometheus and recorded as a range
query's JSON, as a user exports them. ``retrysim calibrate`` must recover the incident from
that file alone, and the calibrated scenario, simulated, must predict what the broker
showed: the tolerances are docs/metrics.md's (the worked example)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from support import PROJECT

from retrysim import load_scenario, simulate
from retrysim.cli.main import main
from retrysim.conformance.metrics import record_broker_metrics
from retrysim.metrics.names import base_name
from retrysim.metrics.prometheus import binaries
from retrysim.scenario.units import parse_duration
from retrysim.session import full_jit
from retrysim.store.sinks import read_table, table_path

SCENARIO = PROJECT / "conf" / "metrics" / "incident-5x.yaml"
# what calibrate is given besides the metrics: the flavor, retry policy and cache, no more
BASE = PROJECT / "examples" / "metrics" / "payments.yaml"
STEP = 2.0  # the scrape interval, s
TRUTH = load_scenario(SCENARIO)

pytestmark = [
    pytest.mark.broker,
    pytest.mark.prometheus,
    pytest.mark.skipif(binaries() is None, reason="prometheus and promtool are not on PATH"),
]


@pytest.fixture(scope="module")
def incident(tmp_path_factory, spark):
    """The incident on the broker, its metrics, the scenario calibrated on them, that
    scenario's run and its comparison with the metrics (in the tests' Spark session)."""
    folder = tmp_path_factory.mktemp("incident")
    recorded = record_broker_metrics(TRUTH, "payments", folder, STEP)
    fitted = folder / "calibrated.yaml"
    assert main(["calibrate", "--metrics", str(recorded.metrics), "--group", "payments",
                 "--scenario", str(BASE), "--output", str(fitted)]) == 0  # fmt: skip
    output = str(folder / "out")
    simulate(spark, load_scenario(fitted), output=output, run_id="calibrated", validate=False)
    stop = SparkSession.stop
    SparkSession.stop = lambda _self: None
    try:
        code = main(["compare", "--metrics", str(recorded.metrics), "--run", "calibrated",
                     "--output", output])  # fmt: skip
    finally:
        SparkSession.stop = stop
        full_jit(spark)
    assert code == 0
    return recorded, yaml.safe_load(fitted.read_text()), output


def _rate_at(profile: list[dict], second: float) -> float:
    for piece in profile:
        if second < parse_duration(piece["until"]) / 1000:
            return piece["per_second"]
    raise AssertionError(f"no piece holds {second} s")


def test_calibrate_recovers_the_incident_from_the_brokers_metrics(incident):
    recorded, fitted, _ = incident
    group = fitted["groups"][0]
    truth = TRUTH.groups[0]
    # the clock: the first sample, within a scrape interval of production's start (a
    # counter's series begins with its first increment)
    start = np.datetime64(fitted["start_at"].rstrip("Z"), "ms").astype(float) / 1000
    assert 0 <= start - recorded.start <= STEP

    def since_t0(duration: str) -> float:
        return start + parse_duration(duration) / 1000 - recorded.start

    # the arrivals: 20, 45, then 20 a second, each within 10 %
    for second, rate in ((15, 20), (45, 45), (75, 20)):
        at = second - (start - recorded.start)
        assert _rate_at(group["workload"]["profile"], at) == pytest.approx(rate, rel=0.10)
    behavior = group["behavior"]
    assert behavior["fail_probability"] == pytest.approx(0.2, rel=0.10)
    [outage] = behavior["outages"]
    assert outage["fail_probability"] == pytest.approx(0.7, rel=0.10)
    # the outage's edges, 32 s and 55 s, within a scrape interval
    assert abs(since_t0(outage["start"]) - 32) <= STEP
    assert abs(since_t0(outage["end"]) - 55) <= STEP
    # the processing times: the means (the histogram's sum over its count) within 10 %,
    # the p99s (the spread the decade-wide buckets allow) within 25 %
    slow = truth.behavior.outages[0].processing_time
    for fit, real in ((behavior["processing_time"], truth.behavior.processing_time),
                      (outage["processing_time"], slow)):  # fmt: skip
        assert parse_duration(fit["mean"]) == pytest.approx(real.mean, rel=0.10), fit
        assert parse_duration(fit["p99"]) == pytest.approx(real.p99, rel=0.25), fit
    # the pool (the base gives none), from the threads busy while the backlog waited
    assert group["consumers"] == {"instances": 1, "threads": 4}


def _observed_buckets(recorded) -> dict[float, float]:
    """The client's histogram over the run: deliveries by bucket bound (not cumulative)."""
    result = json.loads(recorded.metrics.read_text())["data"]["result"]
    totals: dict[float, float] = {}
    for item in result:
        labels = item["metric"]
        if labels["__name__"].endswith("_bucket") and base_name(labels["__name__"]) == (
            "rocketmq_process_time"
        ) and labels.get("consumer_group") == "payments":  # fmt: skip
            values = [float(v) for _, v in item["values"]]
            le = float(labels["le"])
            totals[le] = totals.get(le, 0.0) + values[-1] - values[0]
    bounds = sorted(totals)
    return {b: totals[b] - (totals[a] if a is not None else 0.0)
            for a, b in zip([None, *bounds[:-1]], bounds, strict=True)}  # fmt: skip


def test_the_calibrated_scenario_predicts_what_the_broker_showed(spark, incident):
    recorded, _, output = incident
    rows = {r.quantity: r for r in DeltaTable(table_path(output, "comparison")).to_pandas()
            .itertuples()}  # fmt: skip
    # the backlog's peak: its size within 15 %, its time within two scrape intervals
    lag = rows["lag"]
    assert abs(lag.peak_error) <= 0.15 and abs(lag.peak_shift_s) <= 2 * STEP, lag
    observed = read_table(spark, output, "observed").where(F.col("run_id") == "calibrated")
    totals = {r["quantity"]: (r["observed"], r["simulated"]) for r in observed.groupBy(
        "quantity").agg(F.sum("observed").alias("observed"),
                        F.sum("simulated").alias("simulated")).collect()}  # fmt: skip
    # the deliveries over the run within 10 %; the retries and the DLQ's inflow within 25 %
    # (recorded: the broker delivered 10-16 % more retries and dead-lettered up to 20 %
    # fewer than the calibrated run; docs/metrics.md)
    for quantity, within in (("deliveries", 0.10), ("retries", 0.25), ("dlq", 0.25)):
        seen, predicted = totals[quantity]
        assert predicted == pytest.approx(seen, rel=within), (quantity, seen, predicted)
    # the processing time: the run's histogram in the client's buckets, each bucket's share
    # of the deliveries within 5 % of the broker's
    buckets = _observed_buckets(recorded)
    attempts = read_table(spark, output, "attempts").where(F.col("run_id") == "calibrated")
    took = attempts.select((F.col("end_ms") - F.col("start_ms")).alias("ms")).toPandas()["ms"]
    total = sum(buckets.values())
    low = 0.0
    for bound, count in buckets.items():
        mine = (
            ((took > low) & (took <= bound)).sum() if math.isfinite(bound) else (took > low).sum()
        )
        assert abs(mine / len(took) - count / total) <= 0.05, (bound, mine, count)
        low = bound
