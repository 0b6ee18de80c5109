"""The Spark engine against the independent pure-Python reference, row by row.

A ~10,000-message run with failures, poison messages, outages that cause timeouts, both
timeout modes, a fixed delay level, a disabled DLQ and a horizon that leaves messages
pending. The reference is given each message's listener outcomes and processing times from
the run (the random draws) and recomputes every attempt and transition on its own; chispa
then compares the two DataFrames. Counts are reconciled across all seven tables.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from reference.rocketmq4_concurrent import RefGroup, RefMessage, simulate_all
from support import scenario

from retrysim import simulate
from retrysim.tables import ATTEMPTS, TRANSITIONS, data_schema

HORIZON = "5h"
GROUPS = [
    {
        "name": "payments",
        "topic": "pay",
        "flavor": "rocketmq4.concurrently",
        "consume_timeout": "15m",
        "workload": {"messages": 6000, "over": "40m", "queues": 4, "arrival": "poisson"},
        "behavior": {
            "fail_probability": 0.2,
            "poison_fraction": 0.01,
            "processing_time": {"dist": "lognormal", "mean": "50ms", "p99": "400ms"},
            "outcome_mix": {"reconsume_later": 0.6, "exception": 0.3, "null_return": 0.1},
            "outages": [
                {"start": "5m", "end": "8m", "fail_probability": 1.0},
                {"start": "20m", "end": "22m", "fail_probability": 0.5,
                 "processing_time": "20m"},
            ],
        },
    },  # fmt: skip
    {
        "name": "audit",
        "flavor": "rocketmq4.concurrently",
        "max_reconsume_times": 5,
        "delay_level_when_next_consume": 6,
        "dlq_enabled": False,
        "consume_timeout": "1m",
        "consume_timeout_check": "periodic",
        "workload": {"messages": 4000, "over": "1h", "queues": 3},
        "behavior": {
            "fail_first": 1,
            "poison_fraction": 0.02,
            "fail_probability": 0.1,
            "processing_time": {"dist": "exponential", "mean": "20s"},
        },
    },
]


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    return simulate(
        spark,
        scenario(*GROUPS, horizon=HORIZON, load_bucket="5m", seed=2024),
        output=str(tmp_path_factory.mktemp("reference")),
        run_id="ref",
    )


def _ref_groups(result) -> dict[str, RefGroup]:
    config = scenario(*GROUPS, horizon=HORIZON)
    return {
        g.name: RefGroup(
            group=g.name,
            topic=g.source_topic,
            horizon_ms=config.horizon,
            delay_table_ms=config.broker.message_delay_level,
            max_reconsume_times=16 if g.max_reconsume_times == -1 else g.max_reconsume_times,
            delay_level_when_next_consume=g.delay_level_when_next_consume,
            consume_timeout_ms=g.consume_timeout,
            timeout_check=g.consume_timeout_check,
            dlq_enabled=g.dlq_enabled,
        )
        for g in config.groups
    }


@pytest.fixture(scope="module")
def reference(run):
    draws: dict[tuple[str, int], dict[int, tuple[str | None, int]]] = defaultdict(dict)
    for row in run.attempts.select("group", "msg_id", "delivery", "outcome", "processing_ms").collect():
        draws[(row["group"], row["msg_id"])][row["delivery"]] = (row["outcome"], row["processing_ms"])  # fmt: skip
    messages: dict[str, list[RefMessage]] = defaultdict(list)
    for row in run.messages.select("group", "msg_id", "queue_id", "born_ms").collect():
        messages[row["group"]].append(RefMessage(row["msg_id"], row["queue_id"], row["born_ms"]))
    attempts, transitions = [], []
    for name, cfg in _ref_groups(run).items():
        by_msg = {m.msg_id: draws[(name, m.msg_id)] for m in messages[name]}
        a, t = simulate_all(cfg, messages[name], by_msg)
        attempts += a
        transitions += t
    return attempts, transitions


def _as_df(spark, rows, schema):
    schema = data_schema(schema)
    return spark.createDataFrame([tuple(r[f.name] for f in schema.fields) for r in rows], schema)


def test_scenario_exercises_every_path(run):
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
    ]:
        assert expected in seen, expected
    assert run.summary.where(F.col("pending") > 0).count() >= 1


def test_attempts_equal_the_reference_row_by_row(spark, run, reference):
    expected = _as_df(spark, reference[0], ATTEMPTS)
    actual = run.attempts.select(*data_schema(ATTEMPTS).fieldNames())
    assert actual.count() == len(reference[0]) > 10_000
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_transitions_equal_the_reference_row_by_row(spark, run, reference):
    expected = _as_df(spark, reference[1], TRANSITIONS)
    actual = run.transitions.select(*data_schema(TRANSITIONS).fieldNames())
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_every_message_ends_in_exactly_one_place(run):
    last = (
        run.transitions.groupBy("group", "msg_id")
        .agg(F.max_by("state", "seq").alias("state"))
        .groupBy("group", "state")
        .count()
        .collect()
    )
    ends = {(r["group"], r["state"]): r["count"] for r in last}
    for row in run.summary.collect():
        name = row["group"]
        assert ends.get((name, "Commit"), 0) == row["commits"]
        assert ends.get((name, "DLQ"), 0) == row["dlq"]
        assert ends.get((name, "Discard"), 0) == row["discards"]
        open_states = sum(ends.get((name, s), 0) for s in ("Ready", "Inflight", "WaitingRetry"))
        born_late = run.messages.where(
            (F.col("group") == name) & (F.col("born_ms") >= 5 * 3_600_000)
        ).count()
        assert open_states + born_late == row["pending"]
        assert row["commits"] + row["dlq"] + row["discards"] + row["pending"] == row["messages"]


def test_counts_reconcile_across_tables(run):
    per_group = {
        r["group"]: r
        for r in run.attempts.groupBy("group")
        .agg(
            F.count(F.lit(1)).alias("deliveries"),
            F.sum((F.col("delivery") > 1).cast("long")).alias("retries"),
            F.sum((F.col("result_state") == "Commit").cast("long")).alias("commits"),
            F.sum((F.col("result_state") == "DLQ").cast("long")).alias("dlq"),
            F.sum((F.col("result_state") == "Discard").cast("long")).alias("discards"),
        )
        .collect()
    }
    load = {
        r["group"]: r
        for r in run.load.groupBy("group")
        .agg(*[F.sum(c).alias(c) for c in ("deliveries", "retries", "commits", "dlq", "discards")])
        .collect()
    }
    inflight_transitions = {
        r["group"]: r["count"]
        for r in run.transitions.where(F.col("state") == "Inflight").groupBy("group").count().collect()
    }
    dead = {r["group"]: r["count"] for r in run.dead_letters.groupBy("group").count().collect()}
    for row in run.summary.collect():
        name = row["group"]
        for column in ("deliveries", "retries", "commits", "dlq", "discards"):
            assert row[column] == per_group[name][column] == load[name][column], (name, column)
        assert inflight_transitions[name] == row["deliveries"]
        assert dead.get(name, 0) == row["dlq"]
        assert row["messages"] == run.messages.where(F.col("group") == name).count()


def test_load_gauges_end_where_the_messages_are(run):
    """At the last bucket, WaitingRetry holds exactly the messages pending in WaitingRetry."""
    last_bucket = run.load.agg(F.max("bucket_start_ms")).first()[0]
    gauges = {
        r["group"]: r
        for r in run.load.where(F.col("bucket_start_ms") == last_bucket).collect()
    }
    final = (
        run.transitions.groupBy("group", "msg_id")
        .agg(F.max_by("state", "seq").alias("state"))
        .groupBy("group", "state")
        .count()
        .collect()
    )
    for row in final:
        if row["state"] == "WaitingRetry":
            assert gauges[row["group"]]["waiting_retry"] == row["count"]
        if row["state"] == "Inflight":
            assert gauges[row["group"]]["inflight"] == row["count"]
    for gauge in gauges.values():
        assert gauge["ready_backlog"] == 0  # unlimited capacity: Ready starts at once
