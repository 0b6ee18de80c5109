"""The engine's DataFrame -> DataFrame steps on small literal DataFrames, compared with chispa.

Each test writes the staged attempts by hand (a committed delivery, a retry through the
schedule topic, a 5.x after-backoff move to the DLQ, deliveries cut by the horizon) and the
rows the step must produce, worked out from docs/model.md, not from the engine.
"""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from staged_rows import DLQ_TOPIC, RETRY, SCHED, committed, dead_after_backoff, retried, sort, stage
from support import group, scenario

from retrysim.engine.capacity import peak_concurrency
from retrysim.engine.rounds import (
    with_horizon_cut,
)
from retrysim.tables.dead_letters import dead_letters_from_attempts
from retrysim.tables.group_sums import THREAD_UNITS
from retrysim.tables.load import load_from_attempts
from retrysim.tables.peaks import bucket_changes, run_maxima
from retrysim.tables.schemas import (
    DEAD_LETTERS,
    TRANSITIONS,
    data_schema,
    without_comments,
)
from retrysim.tables.summary import exact_percentiles
from retrysim.tables.transitions import lands_unread, transitions_from_attempts


def transitions(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, without_comments(data_schema(TRANSITIONS)))


def test_transitions_walk_ready_inflight_and_the_end_state(spark):
    attempts = stage(
        spark,
        [
            committed(1, ready=0, start=0, processing=10),
            retried(2, 1, ready=5, start=5, processing=20, level=3, wait=10_000),
            {
                "msg_id": 2,
                "delivery": 2,
                "reconsume_times": 1,
                "source_topic": RETRY,
                "ready_ms": 10_025,
                "ready_reason": "retry_due",
                "result_state": "Ready",
            },
            dead_after_backoff(3, start=7, processing=3, backoff=10_000),
        ],
    )
    expected = transitions(
        spark,
        [
            ("g", 1, 1, 1, "Ready", 0, "T", 0, None, "published"),
            ("g", 1, 1, 2, "Inflight", 0, "T", 0, None, "delivered"),
            ("g", 1, 1, 3, "Commit", 10, "T", 0, None, "CONSUME_SUCCESS"),
            ("g", 2, 1, 1, "Ready", 5, "T", 0, None, "published"),
            ("g", 2, 1, 2, "Inflight", 5, "T", 0, None, "delivered"),
            ("g", 2, 1, 3, "WaitingRetry", 25, SCHED, 2, 3, "RECONSUME_LATER"),
            ("g", 2, 2, 5, "Ready", 10_025, RETRY, 0, None, "retry_due"),
            ("g", 3, 1, 1, "Ready", 7, "T", 0, None, "published"),
            ("g", 3, 1, 2, "Inflight", 7, "T", 0, None, "delivered"),
            ("g", 3, 1, 3, "WaitingRetry", 10, RETRY, 0, None, "EXCEPTION"),
            ("g", 3, 1, 4, "DLQ", 10_010, DLQ_TOPIC, 0, None, "max_reconsume_times"),
        ],
    )
    assert_df_equality(sort(transitions_from_attempts(attempts)), sort(expected))


def test_dead_letters_name_the_dlq_topic_the_moment_and_the_replay(spark):
    attempts = stage(
        spark,
        [
            committed(1, ready=0, start=0, processing=10),
            dead_after_backoff(2, start=0, processing=10, backoff=10_000),
            dead_after_backoff(3, start=5, processing=10, backoff=10_000),
            {
                "msg_id": 3,
                "delivery": 2,
                "ready_ms": 60_000,
                "ready_reason": "replayed",
                "result_state": "Ready",
            },
        ],
    )
    dead = dead_letters_from_attempts(attempts, scenario(group("g", topic="T")))
    expected = spark.createDataFrame(
        [("g", 2, DLQ_TOPIC, 10_010, 1, "T", None), ("g", 3, DLQ_TOPIC, 10_015, 1, "T", 60_000)],
        without_comments(data_schema(DEAD_LETTERS)),
    )
    assert_df_equality(sort(dead), sort(expected))


def test_load_counts_gauges_and_schedule_backlog_per_bucket(spark):
    """Buckets of 1 s over 3 s. msg 1 commits at 0.5 s; msg 2 fails at 1.2 s, waits at
    level 3 until 2.2 s (in the schedule topic), is Ready from 2.2 s and starts at 2.5 s,
    still running at the horizon; msg 3 waits in Ready from 1.5 s to 2.1 s."""
    run = scenario(group("g", workload={"messages": 3}), horizon="3s", load_bucket="1s")
    first = retried(2, 1, ready=1_000, start=1_000, processing=200, level=3, wait=1_000)
    attempts = stage(
        spark,
        [
            committed(1, ready=0, start=0, processing=500),
            {**first, "born_ms": 1_000},
            {**committed(3, ready=1_500, start=2_100, processing=100), "born_ms": 1_500},
            {
                "msg_id": 2,
                "delivery": 2,
                "reconsume_times": 1,
                "source_topic": RETRY,
                "born_ms": 1_000,
                "ready_ms": 2_200,
                "ready_reason": "retry_due",
                "start_ms": 2_500,
                "processing_ms": 1_000,
                "end_ms": 3_500,
                "result_state": "Inflight",
            },
        ],
    )
    attempts = with_horizon_cut(attempts, run.horizon)
    load = load_from_attempts(spark, attempts, run).select(
        "bucket_start_ms",
        "deliveries",
        "first_deliveries",
        "retries",
        "commits",
        "commitlog_writes",
        "inflight",
        "waiting_retry",
        "ready_backlog",
        F.col("schedule_backlog")[2].alias("level3"),
        "busy_thread_ms",
        "oldest_ready_age_ms",
    )
    expected = spark.createDataFrame(
        [
            # writes: 0 s: msg 1's original; 1 s: the originals of msgs 2 and 3 and msg 2's
            # schedule-topic write; 2 s: msg 2's write to the retry topic
            (0, 1, 1, 0, 1, 1, 0, 0, 0, 0, 500.0, 0),
            (1_000, 1, 1, 0, 0, 3, 0, 1, 1, 1, 200.0, 500),
            (2_000, 2, 1, 1, 1, 1, 1, 0, 0, 0, 600.0, 0),
        ],
        "bucket_start_ms long, deliveries long, first_deliveries long, retries long, "
        "commits long, commitlog_writes long, inflight long, waiting_retry long, "
        "ready_backlog long, level3 long, busy_thread_ms double, oldest_ready_age_ms long",
    )
    assert_df_equality(load.orderBy("bucket_start_ms"), expected, ignore_nullable=True)


def test_load_and_summary_peaks_are_exact_within_buckets(spark):
    """Buckets of 1 s on 2 threads. Bucket 0: A [100, 700) and B [200, 500) run; C waits in
    Ready [300, 500) and runs [500, 900) as B ends; D waits [400, 700) and runs [700, 900)
    as A ends; F is Ready from 800 and starts at 1000 with E, Ready and started at 1000.
    Ready reaches 2 in [400, 500) but is 1 at the bucket's end; two threads are busy from 200
    to 900 though none is at the end; D waited 300 ms, the oldest Ready age at its largest.
    Bucket 1: F's Ready spell ends on the bucket's first millisecond, so the 1 it entered
    with is not a value of this bucket (nor is F's age: it peaked at 1000, bucket 0's end)."""
    run = scenario(
        group("g", workload={"messages": 6}, consumers={"instances": 1, "threads": 2}),
        horizon="3s",
        load_bucket="1s",
    )
    spells = {"A": (100, 100, 600), "B": (200, 200, 300), "C": (300, 500, 400),
              "D": (400, 700, 200), "E": (1_000, 1_000, 100), "F": (800, 1_000, 300)}  # fmt: skip
    attempts = stage(
        spark,
        [
            {**committed(n, ready=r, start=s, processing=p), "born_ms": r}
            for n, (r, s, p) in enumerate(spells.values())
        ],
    )
    changes = bucket_changes(attempts, run)
    load = load_from_attempts(spark, attempts, run, changes=changes).select(
        "bucket_start_ms", "ready_backlog", "ready_backlog_max", "inflight", "inflight_max",
        "utilization_max", "oldest_ready_age_ms", "oldest_ready_age_ms_max",
    )  # fmt: skip
    expected = spark.createDataFrame(
        [
            (0, 1, 2, 0, 2, 1.0, 200, 300),
            (1_000, 0, 0, 0, 2, 1.0, 0, 0),
            (2_000, 0, 0, 0, 0, 0.0, 0, 0),
        ],
        "bucket_start_ms long, ready_backlog long, ready_backlog_max long, inflight long, "
        "inflight_max long, utilization_max double, oldest_ready_age_ms long, "
        "oldest_ready_age_ms_max long",
    )
    assert_df_equality(load.orderBy("bucket_start_ms"), expected, ignore_nullable=True)
    maxima = run_maxima(changes).select(
        "group", "ready_backlog", "inflight", "threads_busy", "deliveries", "ready_wait"
    )
    expected = spark.createDataFrame(
        [("g", 2, 2, 2 * THREAD_UNITS, 4, 300)],
        "group string, ready_backlog long, inflight long, threads_busy long, deliveries long, "
        "ready_wait long",
    )
    assert_df_equality(maxima, expected, ignore_nullable=True)


@pytest.mark.parametrize(("pool", "peak"), [(1, {"g": 3}), (2, {"g": 3}), (3, {})])
def test_peak_concurrency_reports_groups_over_their_pool(spark, pool, peak):
    """Three requests overlap in [20, 30); one that starts exactly when another ends does not
    overlap it (the thread is freed first)."""
    attempts = stage(
        spark,
        [
            committed(1, ready=0, start=0, processing=30),
            committed(2, ready=0, start=10, processing=30),
            committed(3, ready=0, start=20, processing=10),
            committed(4, ready=0, start=40, processing=10),  # starts as msg 2 ends
        ],
    )
    assert peak_concurrency(attempts, {"g": pool}) == peak


def test_zero_length_requests_hold_their_thread_for_their_instant(spark):
    attempts = stage(
        spark,
        [
            committed(1, ready=0, start=5, processing=0),
            committed(2, ready=0, start=5, processing=0),
        ],
    )
    assert peak_concurrency(attempts, {"g": 1}) == {"g": 2}
    assert peak_concurrency(attempts, {"g": 2}) == {}


def test_exact_percentiles_equal_spark_percentile(spark):
    """The histogram percentiles are bit for bit Spark's ``percentile``: ties, a single
    value, two values, and spread-out values that need interpolation."""
    import random

    rng = random.Random(5)
    rows = [("a", "Commit", rng.choice([50, 50, 50, 1_050, 6_050])) for _ in range(997)]
    rows += [("a", "DLQ", 17_140_000)]
    rows += [("b", "Commit", 10), ("b", "Commit", 11)]
    rows += [("c", "Commit", rng.randrange(0, 10**9)) for _ in range(3_001)]
    values = spark.createDataFrame(rows, "group string, kind string, value long")
    shares = (0.5, 0.95, 0.99, 0.333)
    expected = values.groupBy("group", "kind").agg(
        F.percentile("value", list(shares)).alias("percentiles")
    )
    assert_df_equality(
        sort(exact_percentiles(values, shares)), sort(expected), ignore_nullable=True
    )


def test_only_an_expired_broadcast_message_is_written_when_discarded(spark):
    """An expired 4.x broadcast message is sent back into %RETRY%<group>: a write nobody reads.
    A 5.x message discarded (dlq_enabled: false) on its retry topic writes nothing."""
    rows = [("Discard", "broadcast_no_retry"), ("Discard", "max_reconsume_times"),
            ("DLQ", "max_reconsume_times"), ("Discard", None)]  # fmt: skip
    frame = spark.createDataFrame(rows, "state string, reason string")
    written = frame.select(lands_unread(F.col("state"), F.col("reason")).alias("w")).collect()
    assert [row["w"] for row in written] == [True, False, False, None]
