"""Schemas of every output table (docs/model.md), as StructType constants.

Each stage ends with ``select_schema(df, SCHEMA)`` so the columns, their order and their
types are a contract checked in one place. Every table is partitioned by ``run_id``; the
``*_DATA`` schemas are the same without it, as stored inside a partition's Parquet files.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

PARTITION_COLUMN = "run_id"


def nullable_schema(*fields: tuple[str, object]) -> StructType:
    """A schema of nullable ``(name, type)`` fields."""
    return StructType([StructField(name, dtype, True) for name, dtype in fields])


RUNS = nullable_schema(
    ("run_id", StringType()),
    ("scenario", StringType()),
    ("seed", LongType()),
    ("config_json", StringType()),
    ("started_at", TimestampType()),
    ("finished_at", TimestampType()),
    ("engine_version", StringType()),
    ("spark_master", StringType()),
    ("status", StringType()),
    ("rounds", IntegerType()),
    ("tables", StringType()),
    # replications (docs/planning.md §3): the id the replications of one scenario or plan
    # point share, the plan point (null outside a plan) and the replication, 1-based; a
    # single run is replication 1 of itself
    ("replication_of", StringType()),
    ("point", IntegerType()),
    ("replication", IntegerType()),
    # the scenario's start_at: the real moment its time 0 stands for (null: none given)
    ("start_at", TimestampType()),
)

MESSAGES = nullable_schema(
    ("run_id", StringType()),
    ("group", StringType()),
    ("topic", StringType()),
    ("msg_id", LongType()),
    ("queue_id", IntegerType()),
    ("born_ms", LongType()),
    ("size_bytes", IntegerType()),
)

ATTEMPTS = nullable_schema(
    ("run_id", StringType()),
    ("group", StringType()),
    ("msg_id", LongType()),
    ("delivery", IntegerType()),
    ("reconsume_times", IntegerType()),
    # the reconsumeTimes of the copy the broker stored: a 4.x send-back's level and DLQ test
    # read it (equal to reconsume_times until a send-back fails and the client resubmits)
    ("broker_reconsume_times", IntegerType()),
    ("source_topic", StringType()),
    ("queue_id", IntegerType()),
    # the instance that ran the delivery (or that a delivery still Ready waits for)
    ("consumer_instance", IntegerType()),
    ("ready_ms", LongType()),
    ("start_ms", LongType()),
    ("processing_ms", LongType()),
    ("end_ms", LongType()),
    ("outcome", StringType()),
    ("result_state", StringType()),
    ("delay_level", IntegerType()),
    ("next_ready_ms", LongType()),
    ("settled_ms", LongType()),
    ("batch_size", IntegerType()),
    # How the delivery entered Ready and left Inflight (and, for after-backoff moves, its
    # WaitingRetry): enough to derive its transitions (transitions.transitions_from_attempts)
    # when a lean run does not store them.
    ("ready_reason", StringType()),
    ("end_state", StringType()),
    ("end_topic", StringType()),
    ("end_queue_id", IntegerType()),
    ("end_reason", StringType()),
    ("leave_state", StringType()),
    ("leave_topic", StringType()),
    ("leave_queue_id", IntegerType()),
    ("leave_reason", StringType()),
    # Where the delivery came from and where its retry goes: the message's born_ms, the
    # topic, queue and Ready reason of the next delivery (null unless it is retried), and
    # whether a replay fixed the message's poison. The engine carries them from round to
    # round; stored, the round files *are* the table's files (no rewrite when staging).
    ("born_ms", LongType()),
    ("next_topic", StringType()),
    ("next_queue_id", IntegerType()),
    ("next_reason", StringType()),
    ("poison_fixed", BooleanType()),
)

# The attempts columns that exist so transitions can be derived from attempts.
DERIVATION_COLUMNS = (
    "ready_reason",
    "end_state",
    "end_topic",
    "end_queue_id",
    "end_reason",
    "leave_state",
    "leave_topic",
    "leave_queue_id",
    "leave_reason",
)
# The attempts columns the engine carries into the next delivery.
ROUTING_COLUMNS = ("born_ms", "next_topic", "next_queue_id", "next_reason", "poison_fixed")

TRANSITIONS = nullable_schema(
    ("run_id", StringType()),
    ("group", StringType()),
    ("msg_id", LongType()),
    ("delivery", IntegerType()),
    ("seq", IntegerType()),
    ("state", StringType()),
    ("at_ms", LongType()),
    ("topic", StringType()),
    ("queue_id", IntegerType()),
    ("delay_level", IntegerType()),
    ("reason", StringType()),
)

DEAD_LETTERS = nullable_schema(
    ("run_id", StringType()),
    ("group", StringType()),
    ("msg_id", LongType()),
    ("dlq_topic", StringType()),
    ("dlq_at_ms", LongType()),
    ("deliveries", IntegerType()),
    ("origin_topic", StringType()),
    ("replayed_at_ms", LongType()),
)

LOAD = nullable_schema(
    ("run_id", StringType()),
    ("group", StringType()),
    ("bucket_start_ms", LongType()),
    ("bucket_ms", LongType()),
    ("deliveries", LongType()),
    ("first_deliveries", LongType()),
    ("retries", LongType()),
    ("commits", LongType()),
    ("dlq", LongType()),
    ("discards", LongType()),
    ("inflight", LongType()),
    ("waiting_retry", LongType()),
    ("ready_backlog", LongType()),
    ("commitlog_writes", LongType()),
    ("commitlog_bytes", LongType()),
    ("replays", LongType()),
    ("schedule_backlog", ArrayType(LongType())),
    ("busy_thread_ms", DoubleType()),
    ("utilization", DoubleType()),
    ("oldest_ready_age_ms", LongType()),
    ("inflight_max", LongType()),
    ("waiting_retry_max", LongType()),
    ("ready_backlog_max", LongType()),
    ("schedule_backlog_max", ArrayType(LongType())),
    ("utilization_max", DoubleType()),
    ("oldest_ready_age_ms_max", LongType()),
)

INSTANCE_LOAD = nullable_schema(
    ("run_id", StringType()),
    ("group", StringType()),
    ("consumer_instance", IntegerType()),
    ("bucket_start_ms", LongType()),
    ("bucket_ms", LongType()),
    ("deliveries", LongType()),
    ("ready_backlog", LongType()),
    ("ready_backlog_max", LongType()),
    ("busy_thread_ms", DoubleType()),
    ("utilization", DoubleType()),
    ("utilization_max", DoubleType()),
)

SUMMARY = nullable_schema(
    ("run_id", StringType()),
    ("group", StringType()),
    ("messages", LongType()),
    ("deliveries", LongType()),
    ("retries", LongType()),
    ("commits", LongType()),
    ("dlq", LongType()),
    ("discards", LongType()),
    ("pending", LongType()),
    ("replayed", LongType()),
    ("amplification", DoubleType()),
    ("commitlog_writes", LongType()),
    ("write_amplification", DoubleType()),
    ("p50_time_to_commit_ms", DoubleType()),
    ("p95_time_to_commit_ms", DoubleType()),
    ("p99_time_to_commit_ms", DoubleType()),
    ("p50_time_to_dlq_ms", DoubleType()),
    ("p95_time_to_dlq_ms", DoubleType()),
    ("p99_time_to_dlq_ms", DoubleType()),
    # the distributions: the time to commit and to the DLQ at summary.QUANTILES (every 5 %,
    # then 99 %, 99.9 % and the largest)
    ("time_to_commit_quantiles_ms", ArrayType(DoubleType())),
    ("time_to_dlq_quantiles_ms", ArrayType(DoubleType())),
    ("max_ready_backlog", LongType()),
    ("max_waiting_retry", LongType()),
    ("peak_utilization", DoubleType()),
    ("max_inflight", LongType()),
    ("max_schedule_backlog", LongType()),
    ("max_oldest_ready_age_ms", LongType()),
    ("peak_deliveries_per_s", LongType()),
    ("peak_retries_per_s", LongType()),
    ("peak_commitlog_writes_per_s", LongType()),
    # consumer instances (instance_load): the one with the most thread time in a bucket,
    # its utilization there, and how many ran no delivery
    ("busiest_instance", IntegerType()),
    ("busiest_instance_utilization", DoubleType()),
    ("idle_instances", IntegerType()),
    ("engine", StringType()),
)

# Staged attempts: the attempts table's data columns in the order the engines build them
# (sequential.py appends rows positionally). Round files in this shape are published as the
# attempts table's files as they are: Parquet and Delta readers find columns by name.
_STAGE_ORDER = (
    "group", "msg_id", "delivery", "reconsume_times", "broker_reconsume_times", "source_topic",
    "queue_id",
    "consumer_instance", "born_ms", "ready_ms", "ready_reason", "start_ms", "processing_ms",
    "end_ms", "outcome",
    "result_state", "delay_level", "next_ready_ms", "settled_ms", "batch_size", "end_state",
    "end_topic", "end_queue_id", "end_reason", "leave_state", "leave_topic", "leave_queue_id",
    "leave_reason", "next_topic", "next_queue_id", "next_reason", "poison_fixed",
)  # fmt: skip
STAGE = StructType([ATTEMPTS[name] for name in _STAGE_ORDER])
assert sorted(STAGE.fieldNames()) == sorted(ATTEMPTS.fieldNames()[1:]), "STAGE != attempts"
# The same as Arrow: the event-by-event stage hands Spark Arrow record batches.
STAGE_ARROW = to_arrow_schema(STAGE)

# A capacity plan (retrysim plan): one row per sweep point and group. Its run_id is the plan's
# id; each point is a run of its own (with replications, runs <point_run_id>-r<k>).
# The metrics are summary columns; with replications each is the mean across them, with its
# 95 % interval in <metric>_ci_low and <metric>_ci_high (null for one replication).
PLAN_METRICS = (
    "messages", "deliveries", "commits", "dlq", "discards", "pending", "amplification",
    "write_amplification", "p50_time_to_commit_ms", "p95_time_to_commit_ms",
    "p99_time_to_commit_ms", "p99_time_to_dlq_ms", "max_ready_backlog", "max_waiting_retry",
    "max_oldest_ready_age_ms", "peak_utilization", "busiest_instance_utilization",
    "idle_instances",
)  # fmt: skip
PLAN = nullable_schema(
    ("run_id", StringType()),
    ("point", IntegerType()),
    ("point_run_id", StringType()),
    ("group", StringType()),
    ("settings_json", StringType()),
    ("instances", IntegerType()),
    ("threads", IntegerType()),
    ("pool", IntegerType()),
    *((metric, DoubleType()) for metric in PLAN_METRICS),
    ("targets_json", StringType()),
    ("replications", IntegerType()),
    # the share of replications that must meet every target, and the share that did
    ("confidence", DoubleType()),
    ("meets_targets_share", DoubleType()),
    ("meets_targets", BooleanType()),
    ("failed_targets", StringType()),
    ("recommended", BooleanType()),
    ("binding_target", StringType()),
    *((f"{metric}_ci_{end}", DoubleType()) for metric in PLAN_METRICS for end in ("low", "high")),
)

SCHEMAS: dict[str, StructType] = {
    "runs": RUNS,
    "messages": MESSAGES,
    "attempts": ATTEMPTS,
    "transitions": TRANSITIONS,
    "dead_letters": DEAD_LETTERS,
    "load": LOAD,
    "instance_load": INSTANCE_LOAD,
    "summary": SUMMARY,
}
# Every table a sink writes and a reader reads: the eight tables of a run, and plans.
ALL_SCHEMAS: dict[str, StructType] = {**SCHEMAS, "plan": PLAN}
# Publication order: runs last, so a run is listed only once all its rows are committed.
TABLE_ORDER = (
    "messages",
    "attempts",
    "transitions",
    "dead_letters",
    "load",
    "instance_load",
    "summary",
    "runs",
)
# What a run writes: every table, or (``--tables lean``, for very large runs) all but the
# two that are derivable: transitions from attempts, messages from the scenario.
TABLE_SETS = {
    "full": TABLE_ORDER,
    "lean": ("attempts", "dead_letters", "load", "instance_load", "summary", "runs"),
}
DERIVED_IN_LEAN = ("messages", "transitions")


def data_schema(schema: StructType) -> StructType:
    """The schema inside a partition's files: everything but the partition column."""
    return StructType([field for field in schema.fields if field.name != PARTITION_COLUMN])


def select_schema(df: DataFrame, schema: StructType) -> DataFrame:
    """Project ``df`` onto ``schema``: exactly its columns, in order, cast to its types."""
    return df.select(*schema_columns(schema))


def schema_columns(schema: StructType) -> list[Column]:
    """The projection :func:`select_schema` applies, as expressions."""
    return [F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields]


def local_rows(spark: SparkSession, rows: list[tuple], schema: StructType) -> DataFrame:
    """``rows`` (values in ``schema``'s order) as a DataFrame of ``schema``, handed to the
    JVM as an Arrow table. PySpark's ``createDataFrame`` of Python rows runs them through a
    Python worker when the plan runs (a run's first one takes seconds to start, on the
    critical path of staging); many rows as literals make a plan slow to analyse."""
    return spark.createDataFrame(arrow_table(rows, schema))


def arrow_table(rows: list[tuple], schema: StructType) -> pa.Table:
    """``rows`` (values in ``schema``'s order) as an Arrow table of ``schema``'s types."""
    arrow = to_arrow_schema(schema)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema.fields]
    return pa.Table.from_arrays(
        [
            pa.array(list(column), type=field.type)
            for column, field in zip(columns, arrow, strict=True)
        ],
        schema=arrow,
    )


def literal_rows(spark: SparkSession, rows: list[tuple], schema: StructType) -> DataFrame:
    """``rows`` as a DataFrame of ``schema``, built from literals in the JVM. PySpark's
    ``createDataFrame`` sends local rows through a Python worker, and a run's first one takes
    a second to start, on the critical path of staging."""
    if not rows:
        return local_rows(spark, rows, schema)
    structs = [
        F.struct(
            *[
                F.lit(value).cast(field.dataType).alias(field.name)
                for value, field in zip(row, schema.fields, strict=True)
            ]
        )
        for row in rows
    ]
    return spark.range(0, 1, numPartitions=1).select(F.inline(F.array(*structs)))


def write_rows(rows: list[tuple], schema: StructType, folder: str) -> str:
    """``rows`` as one Parquet file in ``folder`` (pyarrow), as a table is staged: a run's
    few rows need no Spark job. Returns the folder."""
    os.makedirs(folder, exist_ok=True)
    table = arrow_table(rows, schema)
    pq.write_table(table, os.path.join(folder, "part-00000.parquet"), compression="snappy")
    return folder
