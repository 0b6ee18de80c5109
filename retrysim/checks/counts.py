"""The small per-group aggregates of the load, summary and runs tables, compared on the driver."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from retrysim.checks.invariants import GROUP
from retrysim.tables.schemas import PARTITION_COLUMN

# --------------------------------------------------------------------------- load, summary

LOAD_SUMS = ("deliveries", "first_deliveries", "retries", "commits", "dlq", "discards",
             "replays", "commitlog_writes", "commitlog_bytes")  # fmt: skip
GAUGES = ("inflight", "ready_backlog", "waiting_retry")
# Each gauge's run-wide peak in the summary: the largest of the load's within-bucket maxima.
PEAKS = {"inflight": "max_inflight", "ready_backlog": "max_ready_backlog",
         "waiting_retry": "max_waiting_retry"}  # fmt: skip
SUMMARY_COLUMNS = ("messages", "deliveries", "retries", "commits", "dlq", "discards",
                   "pending", "replayed", "late_send_backs", "amplification",
                   "commitlog_writes", *PEAKS.values())  # fmt: skip


def load_counts(load: DataFrame) -> DataFrame:
    return load.groupBy(*GROUP).agg(
        F.count(F.lit(1)).alias("load_rows"),
        F.count_distinct("bucket_start_ms").alias("load_buckets"),
        F.min("bucket_start_ms").alias("load_first_ms"),
        (F.max("bucket_start_ms") + F.max("bucket_ms")).alias("load_end_ms"),
        F.min("bucket_ms").alias("bucket_ms_min"),
        F.max("bucket_ms").alias("bucket_ms"),
        *[F.sum(name).alias(f"load_{name}") for name in LOAD_SUMS],
        *[F.max_by(name, "bucket_start_ms").alias(f"load_end_{name}") for name in GAUGES],
        *[F.max(f"{name}_max").alias(f"load_peak_{name}") for name in GAUGES],
        *[
            F.count_if(F.col(f"{name}_max") < F.col(name)).alias(f"load_under_{name}")
            for name in GAUGES
        ],
        F.sum("busy_thread_ms").alias("load_busy_thread_ms"),
    )


def instance_counts(instance_load: DataFrame) -> DataFrame:
    """What the instances' rows must add up to: the group's deliveries and thread time."""
    return instance_load.groupBy(*GROUP).agg(
        F.sum("deliveries").alias("instance_deliveries"),
        F.sum("busy_thread_ms").alias("instance_busy_thread_ms"),
        F.count(F.lit(1)).alias("instance_rows"),
    )


def summary_counts(summary: DataFrame) -> DataFrame:
    return summary.groupBy(*GROUP).agg(
        F.count(F.lit(1)).alias("summary_rows"),
        *[F.max(name).alias(f"s_{name}") for name in SUMMARY_COLUMNS],
    )


def runs_counts(runs: DataFrame, complete: str) -> DataFrame:
    return runs.groupBy(PARTITION_COLUMN).agg(
        F.count(F.lit(1)).alias("rows"),
        F.count_if(F.col("status") == F.lit(complete)).alias("complete"),
    )
