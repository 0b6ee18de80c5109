"""The round engine's steps (retrysim.engine.rounds) on small literal DataFrames, compared
with chispa: the horizon's cut, the first and the next frontier, and how a round's files are
read back as tasks. The rows are written by hand from docs/model.md (tests/staged_rows.py).
"""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from staged_rows import RETRY, committed, dead_after_backoff, retried, sort, stage

from retrysim.engine.rounds import (
    OPEN_COST_BYTES,
    conf_set,
    first_frontier,
    frontier_read,
    frontier_split_bytes,
    next_frontier,
    open_cost_bytes,
    parquet_file_sizes,
    with_horizon_cut,
)
from retrysim.tables.schemas import MESSAGES, data_schema, without_comments

# the columns of a frontier these tests look at
SHOWN = ("msg_id", "delivery", "reconsume_times", "source_topic", "queue_id", "ready_ms",
         "ready_reason")  # fmt: skip


def test_horizon_cut_leaves_ready_inflight_and_waiting_states(spark):
    horizon = 1_000
    rows = [
        committed(1, ready=0, start=0, processing=10),  # done before the horizon: untouched
        committed(2, ready=900, start=1_000, processing=10),  # starts at the horizon
        committed(3, ready=900, start=990, processing=10),  # ends at the horizon: running
        dead_after_backoff(4, start=0, processing=10, backoff=990),  # DLQ due at the horizon
        dead_after_backoff(5, start=0, processing=10, backoff=989),  # DLQ just before it
    ]
    cut = with_horizon_cut(stage(spark, rows), horizon).select(
        "msg_id", "result_state", "start_ms", "end_ms", "end_state", "settled_ms", "leave_state"
    )
    expected = spark.createDataFrame(
        [
            (1, "Commit", 0, 10, "Commit", 10, None),
            (2, "Ready", None, None, None, None, None),
            (3, "Inflight", 990, None, None, None, None),
            (4, "WaitingRetry", 0, 10, "WaitingRetry", None, None),
            (5, "DLQ", 0, 10, "WaitingRetry", 999, "DLQ"),
        ],
        "msg_id long, result_state string, start_ms long, end_ms long, end_state string, "
        "settled_ms long, leave_state string",
    )
    assert_df_equality(sort(cut), sort(expected))


def test_first_frontier_takes_messages_born_before_the_horizon(spark):
    messages = spark.createDataFrame(
        [("g", "T", 1, 0, 0, 100), ("g", "T", 2, 1, 999, 100), ("g", "T", 3, 0, 1_000, 100)],
        without_comments(data_schema(MESSAGES)),
    )
    frontier = first_frontier(messages, horizon_ms=1_000).select(*SHOWN)
    expected = spark.createDataFrame(
        [(1, 1, 0, "T", 0, 0, "published"), (2, 1, 0, "T", 1, 999, "published")],
        "msg_id long, delivery int, reconsume_times int, source_topic string, queue_id int, "
        "ready_ms long, ready_reason string",
    )
    assert_df_equality(sort(frontier), sort(expected), ignore_nullable=True)


def test_next_frontier_follows_retries_due_before_the_horizon(spark):
    attempts = stage(
        spark,
        [
            committed(1, ready=0, start=0, processing=10),
            retried(2, 1, ready=0, start=0, processing=10, level=3, wait=10_000),
            retried(3, 2, ready=0, start=0, processing=10, level=4, wait=30_000),  # due too late
            dead_after_backoff(4, start=0, processing=10, backoff=10_000),
        ],
    )
    frontier = next_frontier(attempts, horizon_ms=20_000).select(*SHOWN)
    expected = spark.createDataFrame(
        [(2, 2, 1, RETRY, 0, 10_010, "retry_due")],
        "msg_id long, delivery int, reconsume_times int, source_topic string, queue_id int, "
        "ready_ms long, ready_reason string",
    )
    assert_df_equality(frontier, expected, ignore_nullable=True)


@pytest.mark.parametrize(
    ("files", "megabytes", "per_task"),
    [
        (14, 60, 7),  # round 1's files at 100M messages: Spark's own split made 7 tasks of 2
        (14, 2, 7),  # Spark's own: 12 and 2
        (3, 20, 2),
        (4, 200, 2),  # over Spark's 128 MB: it would split them
    ],
)
def test_a_rounds_files_are_read_as_tasks_that_keep_the_cores_busy(
    spark, tmp_path, files, megabytes, per_task
):
    """frontier_split_bytes predicts Spark's packing: at the split it returns, Spark reads
    a round's files (equal sizes, incompressible) as tasks of ``per_task`` whole files. The
    files are small; the split and open cost are scaled down with them."""
    folder = str(tmp_path / "round")
    rows = 2_000
    spark.range(files * rows, numPartitions=files).select(
        F.sha2(F.col("id").cast("string"), 256).alias("noise")
    ).write.parquet(folder)
    sizes = parquet_file_sizes(folder)
    assert len(sizes) == files
    scale = (megabytes << 20) // max(sizes)
    open_cost = 4 << 20
    split = frontier_split_bytes([size * scale for size in sizes], 2, open_cost)
    assert split is not None
    read_at = {
        **frontier_read(split // scale),
        OPEN_COST_BYTES: open_cost // scale,
    }
    with conf_set(spark, {key: str(value) for key, value in read_at.items()}):
        read = spark.read.parquet(folder)
        tasks = read.groupBy(F.spark_partition_id().alias("task")).count()
        counts = sorted((row["count"] for row in tasks.collect()), reverse=True)
    assert counts == [per_task * rows] * (files // per_task) + [rows * (files % per_task)] * (
        files % per_task > 0
    )
    assert spark.conf.get("spark.sql.files.maxPartitionBytes") != str(split // scale)


def test_the_open_cost_is_read_in_bytes_however_it_was_written(spark):
    """The split is computed from Spark's open cost, which a user may write as ``8m``."""
    assert open_cost_bytes(spark) == 4 << 20  # Spark's default
    with conf_set(spark, {OPEN_COST_BYTES: "8m"}):
        assert open_cost_bytes(spark) == 8 << 20
