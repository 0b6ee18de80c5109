"""The Spark engine against the independent pure-Python reference, row by row.

The reference (tests/reference/simulator.py) was written from docs/model.md and
docs/flavors.md alone; it shares only the hash-based draws with the engine. Here both
simulate the same scenarios and every message, attempt and transition must be equal:

* a ~10,000-message scenario with failures, poison messages, timeouts, outages, every
  engine path (rounds, a pool that fills up, ordered queues, batches, a DLQ replay);
* random scenarios from hypothesis, several groups of every flavor per Spark run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from chispa import assert_df_equality
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType
from reference.simulator import simulate_scenario
from reference.strategies import scenarios
from reference.writes import busiest_second, writes_per_bucket
from support import staged_frame

from retrysim import simulate
from retrysim.engine.choice import SMALL_GROUP_MESSAGES
from retrysim.engine.event_key import simulate_key
from retrysim.engine.rounds import group_plans, key_specs
from retrysim.scenario.loading import build_scenario
from retrysim.tables.schemas import (
    ATTEMPTS,
    DERIVATION_COLUMNS,
    MESSAGES,
    ROUTING_COLUMNS,
    TRANSITIONS,
    data_schema,
)

HORIZON = "5h"
LOGNORMAL = {"dist": "lognormal", "mean": "50ms", "p99": "400ms"}
GROUPS = [
    {
        "name": "payments",
        "topic": "pay",
        "flavor": "rocketmq4.concurrently",
        # the exact check on a 5.1 client: the round engine's timeouts (a periodic one that
        # may find more than 16 of a queue expired runs event by event, as audit does, and
        # so does a 4.9 client's late send-back)
        "consume_timeout_check": "exact",
        "client_version": "5.1",
        "consumers": "unlimited",
        "workload": {"messages": 6000, "over": "40m", "queues": 4, "arrival": "poisson"},
        "behavior": {
            "fail_probability": 0.2,
            "poison_fraction": 0.01,
            "processing_time": LOGNORMAL,
            "outcome_mix": {"reconsume_later": 0.6, "exception": 0.3, "null_return": 0.1},
            "send_back_failure_probability": 0.05,
            "send_back_fallback_probability": 0.05,
            "outages": [
                {"start": "5m", "end": "8m", "fail_probability": 1.0},
                {"start": "20m", "end": "22m", "fail_probability": 0.5, "processing_time": "20m"},
            ],
        },
    },
    {
        "name": "audit",
        "flavor": "rocketmq4.concurrently",
        "max_reconsume_times": 5,
        "delay_level_when_next_consume": 6,
        "dlq_enabled": False,
        "consume_timeout": "1m",
        "consume_timeout_check": "periodic",
        "consumers": "unlimited",
        "workload": {"messages": 2000, "over": "1h", "queues": 3},
        "behavior": {
            "fail_first": 1,
            "poison_fraction": 0.02,
            "fail_probability": 0.1,
            "processing_time": {"dist": "exponential", "mean": "20s"},
        },
    },
    {
        "name": "fifo",
        "flavor": "rocketmq4.orderly",
        "max_reconsume_times": 5,
        "suspend_current_queue_time": "2s",
        "workload": {"messages": 300, "over": "30m", "queues": 4},
        "behavior": {
            "fail_probability": 0.1,
            "poison_fraction": 0.01,
            "processing_time": LOGNORMAL,
        },
    },
    {
        "name": "push",
        "flavor": "rocketmq5.push",
        "max_reconsume_times": 3,
        "consumers": {"instances": 1, "threads": 4},
        "workload": {"messages": 800, "over": "20m", "queues": 2},
        "behavior": {"fail_probability": 0.3, "poison_fraction": 0.02, "processing_time": "500ms"},
        "replay": {"at": "3h", "rate": "10/s"},
    },
    {
        "name": "simple",
        "flavor": "rocketmq5.simple",
        "invisible_duration": "30s",
        "consumers": "unlimited",
        "workload": {"messages": 400, "over": "10m"},
        "behavior": {
            "fail_probability": 0.1,
            "processing_time": {"dist": "exponential", "mean": "20s"},
        },
    },
    {
        "name": "batch",
        "flavor": "rocketmq4.concurrently",
        "consume_message_batch_max_size": 4,
        "ack_index": 1,
        "pull_interval": "1s",
        "workload": {"messages": 400, "over": "2m", "queues": 2},
        "behavior": {
            "fail_probability": 0.05,
            "processing_time": "20ms",
            "send_back_failure_probability": 0.2,
            "send_back_fallback_probability": 0.2,
        },
    },
    {
        "name": "pool",
        "flavor": "rocketmq4.concurrently",
        "consumers": {"instances": 1, "threads": 2},
        "workload": {"messages": 300, "over": "5m", "queues": 2},
        "behavior": {"fail_probability": 0.2, "processing_time": "2s"},
    },
    {
        # 4.x topology: 6 queues on 2 brokers, 2 retry queues each, over 4 instances of 2
        # threads (two of them take 2 queues), the retries' instances saturated by a storm
        "name": "storm",
        "flavor": "rocketmq4.concurrently",
        "brokers": 2,
        "retry_queue_nums": 2,
        "allocate": "averagely",
        "consumers": {"instances": 4, "threads": 2},
        "workload": {"messages": 1500, "over": "10m", "queues": 6},
        "behavior": {
            "fail_probability": 0.05,
            "processing_time": "300ms",
            "outages": [{"start": "2m", "end": "5m", "fail_probability": 0.8}],
        },
    },
    {
        # 8 queues on one broker over 4 instances of one thread: instance 0 owns the retry
        # queue and takes every retry, the others run as units of their own (model §5)
        "name": "units",
        "flavor": "rocketmq4.concurrently",
        "consumers": {"instances": 4, "threads": 1},
        "workload": {"messages": 1200, "over": "10m", "queues": 8},
        "behavior": {
            "fail_probability": 0.1,
            "send_back_failure_probability": 0.1,
            "processing_time": "400ms",
            "outages": [{"start": "2m", "end": "4m", "fail_probability": 0.9}],
        },
    },
    {
        "name": "circle",
        "flavor": "rocketmq4.orderly",
        "allocate": "averagely_by_circle",
        "max_reconsume_times": 2,
        "consumers": {"instances": 3, "threads": 1},
        "workload": {"messages": 300, "over": "5m", "queues": 5},
        "behavior": {"fail_probability": 0.1, "processing_time": "1s"},
    },
]
SCENARIO = {"name": "ref", "seed": 2024, "horizon": HORIZON, "load_bucket": "5m", "groups": GROUPS}


# What the reference gives as transitions rows (an attempts row carries them so that its
# transitions can be derived) or does not model (the engine's routing of the next delivery,
# which the invariant check holds against that delivery).
_NOT_IN_REFERENCE = (*DERIVATION_COLUMNS, *(c for c in ROUTING_COLUMNS if c != "born_ms"))


def _reference_schema(schema: StructType) -> StructType:
    """The table's columns the reference computes."""
    return StructType([f for f in data_schema(schema).fields if f.name not in _NOT_IN_REFERENCE])


def _frame(spark, rows: list[dict], schema) -> DataFrame:
    schema = _reference_schema(schema)
    return spark.createDataFrame([tuple(r[f.name] for f in schema.fields) for r in rows], schema)


def assert_same_rows(actual: DataFrame, expected: DataFrame) -> None:
    """chispa equality, after a short readable list of the rows that differ, if any."""
    missing = expected.exceptAll(actual).limit(10).collect()
    extra = actual.exceptAll(expected).limit(10).collect()
    assert not missing and not extra, f"missing from engine: {missing}\nextra in engine: {extra}"
    # a table's columns carry their comments (field metadata), the expected rows' need not
    assert_df_equality(
        actual, expected, ignore_row_order=True, ignore_nullable=True, ignore_metadata=True
    )


def compare(spark, result, reference: dict[str, list[dict]]) -> None:
    for name, schema in (("messages", MESSAGES), ("attempts", ATTEMPTS),
                         ("transitions", TRANSITIONS)):  # fmt: skip
        columns = _reference_schema(schema).fieldNames()
        actual = result.table(name).select(*columns)
        assert_same_rows(actual, _frame(spark, reference[name], schema))


def compare_writes(spark, result, scenario: dict, reference: dict[str, list[dict]]) -> None:
    """The load's commit-log writes per bucket, and the summary's busiest second of them,
    against the writes the broker's source makes of the reference's deliveries
    (tests/reference/writes.py)."""
    bucket_ms = build_scenario(scenario).load_bucket
    expected = writes_per_bucket(scenario, reference, bucket_ms)
    actual = result.table("load").where(F.col("commitlog_writes") > 0)
    assert_same_rows(
        actual.select("group", "bucket_start_ms", "commitlog_writes"),
        spark.createDataFrame(
            [(g, b, n) for (g, b), n in expected.items()],
            "group string, bucket_start_ms long, commitlog_writes long",
        ),
    )
    peaks = {
        r["group"]: r["peak_commitlog_writes_per_s"]
        for r in result.table("summary").select("group", "peak_commitlog_writes_per_s").collect()
    }
    busiest = busiest_second(scenario, reference)
    assert peaks == {group: busiest.get(group, 0) for group in peaks}


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    """Every round as its own Spark stage (tail_rows=0), so the column rules are exercised for
    every retry; the random scenarios below use the default tail hand-off."""
    return simulate(
        spark,
        build_scenario(SCENARIO),
        output=str(tmp_path_factory.mktemp("reference")),
        run_id="ref",
        validate=False,  # the row-by-row checks are stronger; test_validate covers it
        tail_rows=0,
        small_group=0,  # rounds first: the finite pools too, and the capacity check after
        unit_messages=0,  # a full pool whose instances are units runs as its units
    )


@pytest.fixture(scope="module")
def reference():
    return simulate_scenario(SCENARIO)


def test_scenario_exercises_every_path(run):
    engines = {r["group"]: r["engine"] for r in run.summary.collect()}
    assert engines == {
        "payments": "rounds", "audit": "sequential", "simple": "rounds", "fifo": "sequential",
        "batch": "sequential", "pool": "sequential", "push": engines["push"],
        "storm": "sequential", "circle": "sequential", "units": "sequential",
    }  # fmt: skip
    seen = {
        (r["group"], r["outcome"], r["result_state"])
        for r in run.attempts.select("group", "outcome", "result_state").distinct().collect()
    }
    for expected in [
        ("payments", "TIMEOUT", "WaitingRetry"),
        ("payments", "EXCEPTION", "WaitingRetry"),
        ("payments", "NULL_RETURN", "WaitingRetry"),
        ("payments", "RECONSUME_LATER", "DLQ"),
        ("payments", "CONSUME_SUCCESS", "Commit"),
        ("audit", "TIMEOUT", "WaitingRetry"),
        ("audit", "RECONSUME_LATER", "Discard"),
        ("fifo", "RECONSUME_LATER", "DLQ"),
        ("push", "RECONSUME_LATER", "DLQ"),
        ("simple", "TIMEOUT", "Inflight"),  # invisible until visible again: no WaitingRetry
        ("batch", "CONSUME_SUCCESS", "WaitingRetry"),  # members after ack_index
        ("pool", "CONSUME_SUCCESS", "Commit"),
    ]:
        assert expected in seen, expected
    reasons = {r["reason"] for r in run.transitions.select("reason").distinct().collect()}
    assert {
        "send_back_failed", "send_back_fallback", "replayed", "beyond_ack_index", "local_retry",
    } <= reasons  # fmt: skip
    waited = run.attempts.where(
        (F.col("group") == "pool") & (F.col("start_ms") > F.col("ready_ms"))
    )
    assert waited.count() > 0, "the 2-thread pool should make messages wait in Ready"
    assert run.summary.where(F.col("pending") > 0).count() >= 1


def test_messages_attempts_transitions_equal_the_reference(spark, run, reference):
    assert run.attempts.count() == len(reference["attempts"]) > 10_000
    compare(spark, run, reference)


def test_commit_log_writes_equal_the_sources_puts(spark, run, reference):
    """Every flavor's writes, 5.x pop checkpoints and acks among them, bucket by bucket."""
    compare_writes(spark, run, SCENARIO, reference)
    by_group = {r["group"]: r for r in run.summary.collect()}
    # a 5.x pop writes a checkpoint and an ack through the timer wheel: 5 writes for a
    # message committed at once, against 1 for a 4.x one
    assert (
        by_group["simple"]["write_amplification"] > 4 > by_group["payments"]["write_amplification"]
    )


PATHS = ("rounds first", "whole from the start", "in units")


@settings(max_examples=4, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(scenario=scenarios(groups=8, max_messages=15), path=st.sampled_from(PATHS))
def test_random_scenarios_equal_the_reference(spark, tmp_path_factory, scenario, path):
    """Small finite pools run event by event from the start, whole or in units, or by
    rounds and the capacity check, as larger ones do: each must be the reference."""
    result = simulate(
        spark,
        build_scenario(scenario),
        output=str(tmp_path_factory.mktemp("random")),
        run_id="random",
        validate=False,  # the row-by-row checks are stronger; test_validate covers it
        small_group=0 if path == "rounds first" else SMALL_GROUP_MESSAGES,
        unit_messages=0 if path == "in units" else None,
    )
    reference = simulate_scenario(scenario)
    compare(spark, result, reference)
    compare_writes(spark, result, scenario, reference)


# Found by the random scenarios: an ordered lane idle when a replay arrives had already
# released its next first delivery (published 70 s later), and the replay waited behind it.
REPLAY_ON_IDLE_LANE = {
    "name": "replay-idle-lane", "seed": 0, "horizon": "1h",
    "broker": {"message_delay_level": "1s 2s 5s 10s"},
    "groups": [{
        "name": "g3", "flavor": "rocketmq5.push", "ordered": True, "max_reconsume_times": 3,
        "retry_policy": {"kind": "customized", "intervals": ["10ms"]},
        "consumers": {"instances": 2, "threads": 2},
        "workload": {"messages": 3, "over": "5m", "arrival": "uniform", "queues": 1},
        "behavior": {"fail_probability": 0.7, "poison_fraction": 0.2, "fail_first": 3,
                     "processing_time": {"dist": "exponential", "mean": "10ms"},
                     "ready_wait": "100ms",
                     # no null results: an ordered push dead-letters those at once
                     "outcome_mix": {"reconsume_later": 1, "exception": 1},
                     "outages": [{"start": "1m", "end": "3m", "fail_probability": 1.0}]},
        "replay": {"at": "30s", "rate": "1/s", "poison_fixed": False},
    }],
}  # fmt: skip


def test_a_replay_on_an_idle_ordered_lane_goes_before_a_later_first_delivery(
    spark, tmp_path_factory
):
    result = simulate(
        spark,
        build_scenario(REPLAY_ON_IDLE_LANE),
        output=str(tmp_path_factory.mktemp("replay-idle-lane")),
        run_id="idle",
    )
    replayed = result.attempts.where((F.col("msg_id") == 0) & (F.col("delivery") == 5)).first()
    assert (replayed["ready_ms"], replayed["start_ms"]) == (30_000, 30_100)
    compare(spark, result, simulate_scenario(REPLAY_ON_IDLE_LANE))


# A hypothesis find: a 5.x pop's checkpoint and ack are both put again by the timer wheel
# when the message would be visible again (63 s), a load bucket where no gauge changes;
# the summary's busiest second of writes left that bucket out (1 where the broker has 2).
WRITES_ALONE_IN_A_BUCKET = {
    "name": "writes-alone", "seed": 2, "horizon": "10m",
    "groups": [{
        "name": "g1", "flavor": "rocketmq5.push", "consumers": "unlimited",
        "workload": {"messages": 1, "over": "1ms", "queues": 3},
        "behavior": {"processing_time": "2s", "ready_wait": "3s"},
    }],
}  # fmt: skip


@pytest.mark.parametrize("path", PATHS)
def test_writes_in_a_bucket_without_gauge_changes_count_in_the_busiest_second(
    spark, tmp_path_factory, path
):
    scenario = WRITES_ALONE_IN_A_BUCKET
    result = simulate(
        spark,
        build_scenario(scenario),
        output=str(tmp_path_factory.mktemp("writes-alone")),
        run_id="alone",
        small_group=0 if path == "rounds first" else SMALL_GROUP_MESSAGES,
        unit_messages=0 if path == "in units" else None,
    )
    reference = simulate_scenario(scenario)
    assert busiest_second(scenario, reference) == {"g1": 2}
    compare_writes(spark, result, scenario, reference)


# A hypothesis find: the replay lands at 30 s, the very millisecond a retry waiting on
# instance 0 becomes eligible; nothing else happens at 30 s.
REPLAY_WHILE_A_RETRY_WAITS = {
    "name": "replay-waits", "seed": 0, "horizon": "1m",
    "broker": {"message_delay_level": "1s 2s 5s 10s"},
    "groups": [{
        "name": "g6", "flavor": "rocketmq4.concurrently", "max_reconsume_times": 3,
        "consumers": {"instances": 3, "threads": 1}, "retry_queue_nums": 3,
        "allocate": "averagely_by_circle", "pull_interval": "500ms",
        "workload": {"messages": 15, "over": "10s", "queues": 1},
        "behavior": {"poison_fraction": 0.2, "processing_time": "5ms", "ready_wait": "3s",
                     "outcome_mix": {"reconsume_later": 1, "exception": 1, "null_return": 1},
                     "outages": [{"start": "0s", "end": "3m", "fail_probability": 1.0}],
                     "send_back_failure_probability": 0.3},
        "replay": {"at": "30s", "rate": "60/m", "poison_fixed": True},
    }],
}  # fmt: skip


def test_the_sequential_engine_dispatches_at_the_replay_moment():
    """Plain Python, no Spark: the sequential engine from scratch against the reference.
    It used to skip the dispatch of the replay's millisecond when the replay made nothing
    eligible then, starting the waiting retry at the next pull tick."""
    config = build_scenario(REPLAY_WHILE_A_RETRY_WAITS)
    spec = key_specs(config, group_plans(config))[0]
    ids = np.arange(15, dtype=np.int64)
    rows = staged_frame(simulate_key(spec, ids, ids % 1, ids * 10_000 // 15))
    expected = simulate_scenario(REPLAY_WHILE_A_RETRY_WAITS)["attempts"]
    keys = zip(rows["msg_id"], rows["delivery"], strict=True)
    starts = dict(zip(keys, rows["start_ms"], strict=True))
    assert starts[(7, 3)] == 30_000
    assert {(a["msg_id"], a["delivery"]): a["start_ms"] for a in expected} == {
        key: None if pd.isna(value) else int(value) for key, value in starts.items()
    }


# Traffic and behavior shapes (scenario.md, Workload and behavior): a day in pieces with a
# quiet gap, the downstream slower and failing more at the peak, on rounds (an unlimited
# pool) and event by event (a pool that fills at the peak), Poisson and uniform within.
SHAPES = {
    "name": "shapes", "seed": 7, "horizon": "2h", "load_bucket": "1m",
    "groups": [
        {
            "name": "spiky", "flavor": "rocketmq4.concurrently", "consumers": "unlimited",
            "workload": {"arrival": "profile", "within": "poisson", "queues": 4, "profile": [
                {"until": "2m", "per_second": 2}, {"until": "3m", "per_second": 20},
                {"until": "5m", "per_second": 0}, {"until": "6m", "per_second": 3.5}]},
            "behavior": {
                "fail_probability": 0.05, "processing_time": "30ms",
                "profile": [{"until": "2m", "fail_probability": 0.01},
                            {"until": "4m", "fail_probability": 0.4,
                             "processing_time": {"dist": "exponential", "mean": "2s"}}],
                "outages": [{"start": "3m", "end": "210s", "fail_probability": 0.2,
                             "processing_time": "5s"}],
            },
        },
        {
            "name": "pooled", "flavor": "rocketmq4.concurrently",
            "consumers": {"instances": 2, "threads": 2},
            "workload": {"arrival": "profile", "queues": 4, "profile": [
                {"until": "1m", "per_second": 1}, {"until": "90s", "per_second": 12.5},
                {"until": "4m", "count": 40}]},
            "behavior": {
                "fail_probability": 0.1, "processing_time": "200ms",
                "profile": [{"until": "1m", "processing_time": "50ms"},
                            {"until": "2m", "fail_probability": 0.3, "processing_time": "400ms"}],
            },
        },
    ],
}  # fmt: skip


def test_traffic_and_behavior_profiles_equal_the_reference(spark, tmp_path_factory):
    scenario = build_scenario(SHAPES)
    result = simulate(spark, scenario, output=str(tmp_path_factory.mktemp("shapes")), run_id="s")
    engines = {r["group"]: r["engine"] for r in result.summary.collect()}
    assert engines == {"spiky": "rounds", "pooled": "sequential"}
    counts = {g.name: g.workload.messages for g in scenario.groups}
    assert counts == {"spiky": 240 + 1200 + 0 + 210, "pooled": 60 + 375 + 40}  # rate x length
    compare(spark, result, simulate_scenario(SHAPES))


# A downstream that answers to load (model.md §3): one shared by a group's instances, one
# per instance with batches, one shared by instances taking batches (the lanes' loop serves
# the instances in order), and an ordered flavor on an unlimited pool; each is pushed beyond
# its capacity by a burst, so calls slow down, are shed (at once) and time out.
DOWNSTREAM = {
    "name": "downstream", "seed": 3, "horizon": "30m", "load_bucket": "1m",
    "groups": [
        {
            "name": "shared", "flavor": "rocketmq5.push",
            "consumers": {"instances": 2, "threads": 6},
            "workload": {"messages": 200, "over": "4s", "arrival": "poisson", "queues": 4},
            "behavior": {
                "processing_time": {"dist": "lognormal", "mean": "100ms", "p99": "300ms"},
                "outages": [{"start": "1s", "end": "2s", "fail_probability": 1.0,
                             "processing_time": "5ms"}],
                "downstream": {"capacity": 3, "timeout": "400ms", "shed": 0.3},
            },
        },
        {
            "name": "own", "flavor": "rocketmq4.concurrently",
            "consumers": {"instances": 3, "threads": 4}, "consume_message_batch_max_size": 2,
            "workload": {"messages": 120, "over": "1s", "queues": 6},
            "behavior": {
                "fail_probability": 0.1, "processing_time": {"dist": "exponential", "mean": "80ms"},
                "downstream": {"capacity": 2, "per": "instance", "timeout": "250ms"},
            },
        },
        {
            "name": "batched", "flavor": "rocketmq4.concurrently", "retry_queue_nums": 3,
            "pull_interval": "100ms",  # many start in one millisecond, on every instance
            "consumers": {"instances": 3, "threads": 2}, "consume_message_batch_max_size": 3,
            "workload": {"messages": 150, "over": "1s", "queues": 6, "arrival": "poisson"},
            "behavior": {
                "fail_probability": 0.2, "processing_time": {"dist": "exponential", "mean": "60ms"},
                "downstream": {"capacity": 2, "timeout": "400ms", "shed": 0.5},
            },
        },
        {
            "name": "ordered", "flavor": "http.ordered", "consumers": "unlimited",
            "workload": {"messages": 80, "over": "200ms", "queues": 8},
            "behavior": {"processing_time": "60ms", "downstream": {"capacity": 4, "shed": 1.0}},
        },
    ],
}  # fmt: skip


def test_a_downstream_under_load_equals_the_reference(spark, tmp_path_factory):
    result = simulate(
        spark, build_scenario(DOWNSTREAM), output=str(tmp_path_factory.mktemp("ds")), run_id="d"
    )
    engines = {r["group"]: r["engine"] for r in result.summary.collect()}
    assert engines == dict.fromkeys(("shared", "own", "batched", "ordered"), "sequential")
    attempts = result.attempts
    # the load showed: calls cut off at their timeout, and slowed beyond any base time
    assert attempts.where((F.col("group") == "shared") & (F.col("processing_ms") == 400)).count()
    assert attempts.where((F.col("group") == "own") & (F.col("processing_ms") == 250)).count()
    slowed = attempts.where((F.col("group") == "ordered") & (F.col("processing_ms") > 60))
    assert slowed.count() and attempts.where(F.col("group") == "ordered").count() > 80
    shed = attempts.where((F.col("processing_ms") == 0) & (F.col("outcome") != "CONSUME_SUCCESS"))
    assert shed.where(F.col("group") == "ordered").count()  # rejected at once
    compare(spark, result, simulate_scenario(DOWNSTREAM))
