"""Every scenario in conf/flavors/ runs, shrunk to a few hundred messages, and one of them runs
through the real launcher, ``./spark-submit.sh jobs/simulate.py --scenario ...``."""

from __future__ import annotations

import subprocess

import deltalake
import pytest
from pyspark.sql import functions as F
from support import PROJECT

from retrysim import load_scenario, simulate

pytestmark = pytest.mark.spark  # spark-submit runs, each in its own JVM

FLAVOR_FILES = sorted((PROJECT / "conf" / "flavors").glob("*.yaml"))
SHRINK = ["groups.0.workload.messages=200"]


def test_there_is_an_example_for_every_flavor():
    flavors = {load_scenario(path).groups[0].flavor for path in FLAVOR_FILES}
    assert flavors == {
        "rocketmq4.concurrently", "rocketmq4.orderly", "rocketmq4.broadcasting",
        "http.unordered", "http.ordered", "rocketmq5.push", "rocketmq5.simple",
        "exponential", "customized", "sqs", "pubsub",
    }  # fmt: skip


@pytest.mark.parametrize("path", FLAVOR_FILES, ids=[p.stem for p in FLAVOR_FILES])
def test_flavor_example_runs(spark, tmp_path, path):
    scenario = load_scenario(path, SHRINK)
    group = scenario.groups[0]
    # invariants of every flavor are checked by test_validate; here: does each example run
    result = simulate(spark, scenario, output=str(tmp_path), run_id="example", validate=False)
    (row,) = result.summary.collect()
    assert row["messages"] == 200
    assert row["commits"] + row["dlq"] + row["discards"] + row["pending"] == 200
    assert row["deliveries"] >= row["commits"] + row["dlq"] + row["discards"] > 0
    if group.blocking or group.consume_message_batch_max_size > 1:
        assert row["engine"] == "sequential"
    if group.flavor == "rocketmq4.broadcasting":
        assert row["retries"] == 0
    states = {r[0] for r in result.transitions.select("state").distinct().collect()}
    assert {"Ready", "Inflight"} <= states
    largest_batch = result.attempts.agg(F.max("batch_size")).first()[0]
    assert 1 <= largest_batch <= group.consume_message_batch_max_size


def test_a_flavor_example_through_spark_submit(tmp_path):
    out = tmp_path / "out"
    command = [
        str(PROJECT / "spark-submit.sh"), "jobs/simulate.py",
        "--scenario", "conf/flavors/rocketmq5-simple.yaml", "--output", str(out),
        "--run-id", "simple", "--master", "local[2]", "--set", SHRINK[0], "--quiet",
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=PROJECT, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "retrysim: run simple finished" in done.stdout
    assert "group reports: 200 messages" in done.stdout
    summary = deltalake.DeltaTable(str(out / "summary")).to_pandas()
    assert summary["messages"].tolist() == [200]
    # the console has no Spark, log4j or JVM warning; the JVM's logs are in the run's file
    console = (done.stdout + done.stderr).splitlines()
    assert [line for line in console if "WARN" in line] == []
    (log,) = (out / "logs").glob("simulate-*.log")
    assert "INFO SparkContext: Running Spark version" in log.read_text(encoding="utf-8")
