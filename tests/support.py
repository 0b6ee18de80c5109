"""Small builders shared by the tests (plain data, and a failing sink; no Spark here)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from retrysim.engine.event_stage import lanes_are_independent, sequential_attempts
from retrysim.engine.rounds import group_plans, key_specs
from retrysim.scenario.loading import build_scenario
from retrysim.scenario.spec import Scenario
from retrysim.store.sinks import DeltaRsSink, DeltaSparkSink
from retrysim.tables.group_sums import GroupSumsParam
from retrysim.tables.schemas import STAGE_ARROW

# The repository's root: conf/, jobs/, notebooks/ and the launchers are read from here.
PROJECT = Path(__file__).resolve().parents[1]

# JVM options for the tests' short-lived JVMs (spark-submit, notebooks): they spend half their
# CPU in the C2 JIT compiler, and C1 alone halves a run's cost without changing a result.
# C1 alone gets a 48 MB code cache, which a plan's many query plans can fill (the JVM then
# stops compiling and Spark fails): reserve more.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m -XX:+UseSerialGC"

# conf/flash-sale.yaml, small: 200 orders in 1 s at ~100 ms each and no failures (so the tail
# of the time to commit is queueing, not retries); pools of 4, 8 and 16 threads take about 40,
# 80 and 160 orders per second. The plans of tests/planning run it against
# p99_time_to_commit=2s and max_ready_backlog=100: one instance of 4 threads misses both, two
# the backlog, four meet both.
SMALL_FLASH_SALE = (
    "groups.0.workload.messages=200",
    "groups.0.workload.over=1s",
    "groups.0.behavior.fail_probability=0",
    "horizon=2m",
    "load_bucket=1s",
)

# conf/retry-storm.yaml, small: 1,500 orders in 5 minutes, a 2-minute outage, every retry on
# instance 0's one retry queue (the report tests draw its report and its screenshot).
SMALL_RETRY_STORM = (
    "groups.0.workload.messages=1500",
    "groups.0.workload.over=5m",
    "groups.0.behavior.outages.0.start=1m",
    "groups.0.behavior.outages.0.end=3m",
    "groups.0.consumers.threads=2",
    "horizon=1h",
)

DEFAULT_TABLE_MS = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
    420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)  # fmt: skip


# A 4.x group simulated whole by the compiled loop that reaches most of what the tables
# sum up: three instances by queue with two retry queues, a full pool, timeouts, failed
# send-backs, the producer fallback's dead letters, an outage, the schedule topic's levels
# (a delay table of five), and work left at a 100 s horizon.
BUSY_GROUP: dict[str, Any] = {
    "name": "busy", "flavor": "rocketmq4.concurrently", "max_reconsume_times": 2,
    "consumers": {"instances": 3, "threads": 2}, "retry_queue_nums": 2,
    "consume_timeout": "1s",
    "workload": {"messages": 2500, "over": "80s", "queues": 4},
    "behavior": {"fail_probability": 0.2,
                 "processing_time": {"dist": "lognormal", "mean": "80ms", "p99": "900ms"},
                 "outages": [{"start": "20s", "end": "40s", "fail_probability": 0.9}],
                 "send_back_failure_probability": 0.1,
                 "send_back_fallback_probability": 0.1},
}  # fmt: skip


def group(name: str, **overrides: Any) -> dict[str, Any]:
    """A rocketmq4.concurrently group with one message at t=0 and zero processing time."""
    base: dict[str, Any] = {
        "name": name,
        "flavor": "rocketmq4.concurrently",
        "workload": {"messages": 1, "over": "0s", "queues": 1},
        "behavior": {"fail_probability": 0.0, "processing_time": "0ms"},
    }
    return _merge(base, overrides)


def scenario(*groups: dict[str, Any], **top: Any) -> Scenario:
    data: dict[str, Any] = {"name": "test", "seed": 7, "horizon": "1d", "groups": list(groups)}
    return build_scenario(_merge(data, top))


def retrying_scenario(name: str, seed: int, messages: int) -> Scenario:
    """A small 4.x group on unlimited consumers whose retries reach the DLQ now and then: a
    run of a few seconds, for the tests of what happens around runs (readers, management)."""
    pay = group(
        "pay", max_reconsume_times=2, consumers="unlimited",
        workload={"messages": messages, "over": "1m", "queues": 2},
        behavior={"fail_probability": 0.3, "processing_time": "10ms"},
    )  # fmt: skip
    return scenario(pay, name=name, seed=seed, horizon="20m", load_bucket="1m")


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class _FailingDeadLetters:
    """A sink failing to publish the dead_letters table (the other data tables, published
    side by side, commit; the runs row stays publishing)."""

    def __init__(self) -> None:
        self.published: list[str] = []

    def publish_runs(self, spark, output, table, staged, step="publish") -> None:
        if table == "dead_letters":
            raise RuntimeError(f"injected failure before publishing {table}")
        super().publish_runs(spark, output, table, staged, step)
        self.published.append(table)


class FailingDeadLetters(_FailingDeadLetters, DeltaRsSink):
    """The delta-rs sink, failing at dead_letters."""


class FailingDeadLettersSpark(_FailingDeadLetters, DeltaSparkSink):
    """The delta-spark sink, failing at dead_letters."""


PUBLISHED_BEFORE_THE_FAILURE = {"runs", "messages", "attempts", "transitions", "load",
                                "instance_load", "summary"}  # fmt: skip


def simulated_with_sums(spark, folder: Path, data: dict[str, Any]) -> tuple:
    """Every group of the scenario ``data`` event by event, as the stage runs them (on two
    partitions), with the tasks' sums: (scenario, the attempts read back from ``folder``,
    {group: GroupSums})."""
    config = build_scenario(data)
    plans = group_plans(config)
    sums = spark.sparkContext.accumulator({}, GroupSumsParam())
    per_lane = {(0, plan.name) for plan in plans if lanes_are_independent(plan)}  # KeySpec.key
    attempts = sequential_attempts(spark, key_specs(config, plans), per_lane, 2, sums=sums)
    path = str(folder / "attempts")
    attempts.write.parquet(path)
    return (
        config,
        spark.read.parquet(path),
        {group: part for (_, group), part in sums.value.items()},
    )


def staged_frame(batches: Iterable[pa.RecordBatch]) -> pd.DataFrame:
    """The event loop's staged rows (``simulate_key``'s record batches) as one frame, its
    nullable integers as pandas' nullable integers."""
    table = pa.Table.from_batches(list(batches), schema=STAGE_ARROW)
    return table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype(),
                                         pa.int32(): pd.Int32Dtype()}.get)  # fmt: skip
