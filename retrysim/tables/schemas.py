"""Schemas of every output table (docs/model.md), as StructType constants.

Each stage ends with ``select_schema(df, SCHEMA)`` so the columns, their order and their
types are a contract checked in one place. Every table is partitioned by ``run_id``; the
``*_DATA`` schemas are the same without it, as stored inside a partition's Parquet files.

Every field carries its column's comment (field metadata ``{"comment": ...}``, the docs'
meaning of the column in a few words): this module is the one source of what
``DESCRIBE TABLE`` shows, and tests/tables/test_column_docs.py holds the docs and these
columns to each other. Spark is given :func:`without_comments` where the rows it reads or
makes end up in staged files.
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
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

PARTITION_COLUMN = "run_id"
COMMENT = "comment"  # the field metadata key Spark and Delta read a column's comment from


def nullable_schema(*fields: tuple[str, DataType] | tuple[str, DataType, str]) -> StructType:
    """A schema of nullable ``(name, type)`` or ``(name, type, comment)`` fields."""
    return StructType(
        [
            StructField(name, dtype, True, {COMMENT: text[0]} if text else None)
            for name, dtype, *text in fields
        ]
    )


def comment(field: StructField) -> str | None:
    """The column's comment, if it has one."""
    return (field.metadata or {}).get(COMMENT)


def without_comments(schema: StructType) -> StructType:
    """``schema`` with no field metadata, for Spark where its rows end up in staged files:
    the optimizer drops ``select_schema``'s no-op casts and aliases, so an input column's
    metadata reaches the Parquet footer Spark writes although ``df.schema`` no longer shows
    it, and staged files must be the same with or without comments."""
    return StructType([StructField(f.name, f.dataType, f.nullable) for f in schema.fields])


# Columns (and phrases) several tables share.
_RUN_ID = ("run_id", StringType(), "the run this row belongs to (the Delta partition)")
_GROUP = ("group", StringType(), "the consumer group this row belongs to")
_MSG_ID = ("msg_id", LongType(), "the message's id, 0-based within its group")
_IN_MS = "in ms since the scenario start"
_AT_BUCKET_END = "at the bucket's end"
_UNLIMITED_NULL = "null for an unlimited pool"

RUNS = nullable_schema(
    _RUN_ID,
    ("scenario", StringType(), "the scenario's name"),
    ("seed", LongType(), "the seed of every random draw (a replication's own seed)"),
    (
        "config_json",
        StringType(),
        "the scenario as JSON, every default resolved and times in ms",
    ),
    ("started_at", TimestampType(), "when the run started (wall-clock time, UTC)"),
    (
        "finished_at",
        TimestampType(),
        "when the run's tables were staged, before publishing (wall-clock time, UTC)",
    ),
    ("engine_version", StringType(), "the retrysim version that simulated the run"),
    ("spark_master", StringType(), "the Spark master the run ran on"),
    (
        "status",
        StringType(),
        "publishing while the run's tables are committed, complete after (readers show "
        "complete runs only)",
    ),
    ("rounds", IntegerType(), "the rounds the round engine ran for the run"),
    (
        "tables",
        StringType(),
        "full, or lean: no transitions and messages rows (readers derive them)",
    ),
    # replications (docs/planning.md §3): the id the replications of one scenario or plan
    # point share, the plan point (null outside a plan) and the replication, 1-based; a
    # single run is replication 1 of itself
    (
        "replication_of",
        StringType(),
        "the id the replications of one scenario or plan point share (a single run: its own id)",
    ),
    ("point", IntegerType(), "the run's plan point; null outside a plan"),
    ("replication", IntegerType(), "the run's replication, 1-based (a single run: 1)"),
    # the scenario's start_at: the real moment its time 0 stands for (null: none given)
    (
        "start_at",
        TimestampType(),
        "the real moment the scenario's time 0 stands for (null if none); readers put every "
        "*_ms moment on that clock as *_ts",
    ),
)

MESSAGES = nullable_schema(
    _RUN_ID,
    _GROUP,
    ("topic", StringType(), "the source topic the message is published to"),
    _MSG_ID,
    ("queue_id", IntegerType(), "the source topic's queue: msg_id mod the topic's queues"),
    ("born_ms", LongType(), f"when the message is published, {_IN_MS}"),
    ("size_bytes", IntegerType(), "the message's size in bytes"),
)

ATTEMPTS = nullable_schema(
    _RUN_ID,
    _GROUP,
    _MSG_ID,
    ("delivery", IntegerType(), "the delivery's number for its message, 1-based"),
    (
        "reconsume_times",
        IntegerType(),
        "the reconsume count the listener sees: 0 on a first delivery and after a replay",
    ),
    # the reconsumeTimes of the copy the broker stored: a 4.x send-back's level and DLQ test
    # read it (equal to reconsume_times until a send-back fails and the client resubmits)
    (
        "broker_reconsume_times",
        IntegerType(),
        "the reconsume count of the commit-log copy the delivery came from (a 4.x "
        "send-back's level and DLQ test read it)",
    ),
    ("source_topic", StringType(), "the topic the delivery was Ready on"),
    ("queue_id", IntegerType(), "the queue the delivery was Ready on"),
    # the instance that ran the delivery (or that a delivery still Ready waits for)
    (
        "consumer_instance",
        IntegerType(),
        "the instance (0-based) that ran the delivery, or that it waits for",
    ),
    ("ready_ms", LongType(), f"when the delivery became Ready, {_IN_MS}"),
    ("start_ms", LongType(), f"when the delivery started (Inflight), {_IN_MS}; null if not"),
    (
        "processing_ms",
        LongType(),
        "how long the listener and its thread ran, in ms (a batch's: the members' sum)",
    ),
    (
        "end_ms",
        LongType(),
        f"when the delivery's result was settled (its timeout at the latest), {_IN_MS}",
    ),
    (
        "outcome",
        StringType(),
        "the delivery's outcome: CONSUME_SUCCESS, RECONSUME_LATER, EXCEPTION, NULL_RETURN or "
        "TIMEOUT",
    ),
    (
        "result_state",
        StringType(),
        "the state the delivery left the message in: Ready, Inflight, Commit, WaitingRetry, "
        "DLQ or Discard",
    ),
    (
        "delay_level",
        IntegerType(),
        "the 4.x schedule level of a broker retry, or of a dead letter or expired broadcast "
        "message waiting in the schedule topic; else null",
    ),
    ("next_ready_ms", LongType(), f"when the retry becomes Ready, {_IN_MS} (retries only)"),
    (
        "settled_ms",
        LongType(),
        f"when the message reached Commit, DLQ or Discard in this delivery, {_IN_MS}; else null",
    ),
    (
        "batch_size",
        IntegerType(),
        "the deliveries in its consume request (1 without batches; null if not started)",
    ),
    # How the delivery entered Ready and left Inflight (and, for after-backoff moves, its
    # WaitingRetry): enough to derive its transitions (transitions.transitions_from_attempts)
    # when a lean run does not store them.
    (
        "ready_reason",
        StringType(),
        "why the delivery became Ready: published, retry_due, local_retry, visible_again or "
        "replayed",
    ),
    (
        "end_state",
        StringType(),
        "the state entered on leaving Inflight: Commit, WaitingRetry, DLQ or Discard",
    ),
    ("end_topic", StringType(), "the topic of the state entered on leaving Inflight"),
    ("end_queue_id", IntegerType(), "the queue of the state entered on leaving Inflight"),
    ("end_reason", StringType(), "the reason of the state entered on leaving Inflight"),
    (
        "leave_state",
        StringType(),
        "DLQ or Discard entered at settled_ms after a WaitingRetry (an after-backoff leave)",
    ),
    ("leave_topic", StringType(), "the topic of the state entered after the WaitingRetry"),
    ("leave_queue_id", IntegerType(), "the queue of the state entered after the WaitingRetry"),
    ("leave_reason", StringType(), "the reason of the state entered after the WaitingRetry"),
    # Where the delivery came from and where its retry goes: the message's born_ms, the
    # topic, queue and Ready reason of the next delivery (null unless it is retried), and
    # whether a replay fixed the message's poison. The engine carries them from round to
    # round; stored, the round files *are* the table's files (no rewrite when staging).
    ("born_ms", LongType(), f"when the message was published, {_IN_MS}"),
    (
        "next_topic",
        StringType(),
        "the topic the retry is Ready on (set exactly when next_ready_ms is)",
    ),
    (
        "next_queue_id",
        IntegerType(),
        "the queue the retry is Ready on (set exactly when next_ready_ms is)",
    ),
    (
        "next_reason",
        StringType(),
        "why the retry becomes Ready (set exactly when next_ready_ms is)",
    ),
    (
        "poison_fixed",
        BooleanType(),
        "true after a replay with replay.poison_fixed: the message's poison no longer fails it",
    ),
    # A 4.x concurrently client before 5.1.0 sends a delivery back a second time when the
    # cleaner already sent it back and its listener then fails: two copies of the message
    # live on, each with its deliveries (docs/model.md §6, the late send-back). A message's
    # deliveries are numbered in the order they start, so the one a delivery retries is
    # named where it is not the one before.
    (
        "parent_delivery",
        IntegerType(),
        "the delivery whose send-back or dead letter this one follows, where that is not "
        "delivery - 1 (a message sent back twice); else null",
    ),
    (
        "copy_state",
        StringType(),
        "the second send-back's state: WaitingRetry, DLQ or Discard, entered at copy_ms; null "
        "unless the listener of a delivery the cleaner sent back failed on a 4.9 client",
    ),
    ("copy_ms", LongType(), f"when the second send-back happened (the listener's end), {_IN_MS}"),
    ("copy_topic", StringType(), "the topic of the second send-back's state"),
    ("copy_queue_id", IntegerType(), "the queue of the second send-back's state"),
    (
        "copy_delay_level",
        IntegerType(),
        "the schedule level of the second send-back's WaitingRetry, else null",
    ),
    (
        "copy_ready_ms",
        LongType(),
        f"when the second copy becomes Ready on the retry topic, {_IN_MS}; else null",
    ),
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
# The attempts columns of a 4.9 client's second send-back (null without one): only the
# event-by-event engine sends a delivery back twice (engine/choice.py).
LATE_SEND_BACK_COLUMNS = (
    "parent_delivery", "copy_state", "copy_ms", "copy_topic", "copy_queue_id",
    "copy_delay_level", "copy_ready_ms",
)  # fmt: skip
# The attempts columns the engine carries into the next delivery.
ROUTING_COLUMNS = ("born_ms", "next_topic", "next_queue_id", "next_reason", "poison_fixed")

TRANSITIONS = nullable_schema(
    _RUN_ID,
    _GROUP,
    _MSG_ID,
    ("delivery", IntegerType(), "the delivery that changed state, 1-based"),
    (
        "seq",
        IntegerType(),
        "the change's order, 4 * (delivery - 1) + k: k = 1 Ready, 2 Inflight, 3 the end "
        "state, 4 the leave after WaitingRetry",
    ),
    (
        "state",
        StringType(),
        "the state entered: Ready, Inflight, Commit, WaitingRetry, DLQ or Discard",
    ),
    ("at_ms", LongType(), f"when the state was entered, {_IN_MS}"),
    ("topic", StringType(), "the topic the message is on in that state"),
    ("queue_id", IntegerType(), "the queue the message is on in that state"),
    ("delay_level", IntegerType(), "the 4.x schedule level of a WaitingRetry, else null"),
    (
        "reason",
        StringType(),
        "why the state was entered: a Ready reason, delivered, the outcome, or a send-back "
        "or leave reason",
    ),
)

DEAD_LETTERS = nullable_schema(
    _RUN_ID,
    _GROUP,
    _MSG_ID,
    ("dlq_topic", StringType(), "the DLQ topic, %DLQ%<group>"),
    ("dlq_at_ms", LongType(), f"when the message moved to the DLQ, {_IN_MS}"),
    ("deliveries", IntegerType(), "the deliveries the message had made"),
    ("origin_topic", StringType(), "the topic the message came from, where a replay re-sends it"),
    (
        "replayed_at_ms",
        LongType(),
        f"when a DLQ replay re-sent the message, {_IN_MS}; else null",
    ),
)

_BUCKET_START = ("bucket_start_ms", LongType(), f"the bucket's start, {_IN_MS}")
_BUCKET_MS = ("bucket_ms", LongType(), "the bucket's length in ms (the scenario's load_bucket)")
LOAD = nullable_schema(
    _RUN_ID,
    _GROUP,
    _BUCKET_START,
    _BUCKET_MS,
    ("deliveries", LongType(), "consume starts in the bucket"),
    (
        "first_deliveries",
        LongType(),
        "consume starts of first deliveries (published or replayed) in the bucket",
    ),
    ("retries", LongType(), "consume starts of retries in the bucket"),
    ("commits", LongType(), "messages committed in the bucket"),
    ("dlq", LongType(), "messages moved to the DLQ in the bucket"),
    ("discards", LongType(), "messages discarded in the bucket"),
    (
        "inflight",
        LongType(),
        f"deliveries started and not yet settled, {_AT_BUCKET_END}",
    ),
    (
        "waiting_retry",
        LongType(),
        f"messages between a failed delivery and their next Ready moment, {_AT_BUCKET_END}",
    ),
    ("ready_backlog", LongType(), f"messages Ready and not started, {_AT_BUCKET_END}"),
    (
        "commitlog_writes",
        LongType(),
        "broker commit-log writes in the bucket: publishes, replays, schedule-topic and "
        "retry-topic copies, DLQ moves",
    ),
    ("commitlog_bytes", LongType(), "the bytes of those writes: writes x size_bytes"),
    ("replays", LongType(), "dead letters re-published by a replay in the bucket"),
    (
        "schedule_backlog",
        ArrayType(LongType()),
        f"4.x: messages in SCHEDULE_TOPIC_XXXX per delay level (index = level - 1), "
        f"{_AT_BUCKET_END}; empty for other flavors",
    ),
    (
        "busy_thread_ms",
        DoubleType(),
        "consumer thread time used in the bucket, in ms (split exactly across buckets)",
    ),
    (
        "utilization",
        DoubleType(),
        f"busy_thread_ms / (threads x bucket_ms); {_UNLIMITED_NULL}",
    ),
    (
        "oldest_ready_age_ms",
        LongType(),
        f"the age in ms of the oldest message Ready {_AT_BUCKET_END} (0 when none)",
    ),
    ("inflight_max", LongType(), "inflight's largest value within the bucket"),
    ("waiting_retry_max", LongType(), "waiting_retry's largest value within the bucket"),
    ("ready_backlog_max", LongType(), "ready_backlog's largest value within the bucket"),
    (
        "schedule_backlog_max",
        ArrayType(LongType()),
        "per delay level, schedule_backlog's largest value within the bucket",
    ),
    (
        "utilization_max",
        DoubleType(),
        f"the most threads busy at once within the bucket, over the pool; {_UNLIMITED_NULL}",
    ),
    (
        "oldest_ready_age_ms_max",
        LongType(),
        "the oldest Ready message's largest age within the bucket, in ms",
    ),
)

INSTANCE_LOAD = nullable_schema(
    _RUN_ID,
    _GROUP,
    ("consumer_instance", IntegerType(), "the consumer instance, 0-based"),
    _BUCKET_START,
    _BUCKET_MS,
    ("deliveries", LongType(), "deliveries the instance started in the bucket"),
    (
        "ready_backlog",
        LongType(),
        f"deliveries Ready for this instance and not started, {_AT_BUCKET_END}",
    ),
    ("ready_backlog_max", LongType(), "ready_backlog's largest value within the bucket"),
    (
        "busy_thread_ms",
        DoubleType(),
        "the instance's thread time in the bucket, in ms (exact)",
    ),
    (
        "utilization",
        DoubleType(),
        f"busy_thread_ms / (threads x bucket_ms); {_UNLIMITED_NULL}",
    ),
    (
        "utilization_max",
        DoubleType(),
        f"the most of its threads busy at once within the bucket, over threads; {_UNLIMITED_NULL}",
    ),
)


_UNTIL = {"commit": "commit", "dlq": "the DLQ"}


def _percentile(share: str, until: str) -> tuple[str, DataType, str]:
    return (
        f"p{share}_time_to_{until}_ms",
        DoubleType(),
        f"the exact {share}th percentile of the time from publish to {_UNTIL[until]}, in ms",
    )


def _quantiles(until: str) -> tuple[str, DataType, str]:
    return (
        f"time_to_{until}_quantiles_ms",
        ArrayType(DoubleType()),
        f"the exact times from publish to {_UNTIL[until]} in ms at 0, 5, ..., 95, 99, 99.9 "
        "and 100 %; null when no message got there",
    )


SUMMARY = nullable_schema(
    _RUN_ID,
    _GROUP,
    ("messages", LongType(), "messages the group publishes"),
    ("deliveries", LongType(), "deliveries started"),
    ("retries", LongType(), "deliveries started that were retries"),
    ("commits", LongType(), "messages (copies, with late_send_backs) committed"),
    (
        "dlq",
        LongType(),
        "messages (copies) in the DLQ at the end (dead letters not replayed)",
    ),
    ("discards", LongType(), "messages (copies) discarded"),
    (
        "pending",
        LongType(),
        "messages (copies) neither committed, dead-lettered nor discarded by the horizon",
    ),
    ("replayed", LongType(), "dead letters re-sent by a DLQ replay"),
    # a message a 4.9 client sent back twice lives on as two copies, each ending once: the
    # commits, dlq, discards and pending count copies, messages + late_send_backs in all
    (
        "late_send_backs",
        LongType(),
        "second copies a 4.9 client sent back after the cleaner (commits, dlq, discards and "
        "pending count each copy: they add up to messages + late_send_backs)",
    ),
    ("amplification", DoubleType(), "deliveries per message"),
    ("commitlog_writes", LongType(), "broker commit-log writes before the horizon"),
    ("write_amplification", DoubleType(), "commit-log writes per message"),
    _percentile("50", "commit"),
    _percentile("95", "commit"),
    _percentile("99", "commit"),
    _percentile("50", "dlq"),
    _percentile("95", "dlq"),
    _percentile("99", "dlq"),
    # the distributions: the time to commit and to the DLQ at summary.QUANTILES (every 5 %,
    # then 99 %, 99.9 % and the largest)
    _quantiles("commit"),
    _quantiles("dlq"),
    (
        "max_ready_backlog",
        LongType(),
        "the most messages Ready and not started at once in the run (exact)",
    ),
    ("max_waiting_retry", LongType(), "the most messages in WaitingRetry at once (exact)"),
    ("peak_utilization", DoubleType(), "the most threads busy at once, over the pool (exact)"),
    ("max_inflight", LongType(), "the most messages in consumption at once (exact)"),
    (
        "max_schedule_backlog",
        LongType(),
        "4.x: the most messages in SCHEDULE_TOPIC_XXXX at once, all levels together",
    ),
    (
        "max_oldest_ready_age_ms",
        LongType(),
        "the largest age in ms of a message while Ready, over the run (exact)",
    ),
    (
        "peak_deliveries_per_s",
        LongType(),
        "deliveries started in the busiest whole second of the run",
    ),
    ("peak_retries_per_s", LongType(), "retries started in the busiest whole second of the run"),
    (
        "peak_commitlog_writes_per_s",
        LongType(),
        "commit-log writes in the busiest whole second of the run",
    ),
    # consumer instances (instance_load): the one with the most thread time in a bucket,
    # its utilization there, and how many ran no delivery
    (
        "busiest_instance",
        IntegerType(),
        "the consumer instance with the most thread time in one load bucket",
    ),
    (
        "busiest_instance_utilization",
        DoubleType(),
        "the busiest instance's utilization in that bucket",
    ),
    ("idle_instances", IntegerType(), "consumer instances that ran no delivery in the whole run"),
    ("engine", StringType(), "the engine that simulated the group: rounds or sequential"),
)

# Staged attempts: the attempts table's data columns in the order the engines build them
# (the event loop writes rows positionally: engine/event_rows.py). Round files in this shape
# are published as the attempts table's files as they are: Parquet and Delta readers find
# columns by name.
# Without comments: Spark makes these rows (mapInArrow, empty rounds) and writes the files.
_STAGE_ORDER = (
    "group", "msg_id", "delivery", "reconsume_times", "broker_reconsume_times", "source_topic",
    "queue_id",
    "consumer_instance", "born_ms", "ready_ms", "ready_reason", "start_ms", "processing_ms",
    "end_ms", "outcome",
    "result_state", "delay_level", "next_ready_ms", "settled_ms", "batch_size", "end_state",
    "end_topic", "end_queue_id", "end_reason", "leave_state", "leave_topic", "leave_queue_id",
    "leave_reason", "next_topic", "next_queue_id", "next_reason", "parent_delivery",
    "copy_state", "copy_ms", "copy_topic", "copy_queue_id", "copy_delay_level", "copy_ready_ms",
    "poison_fixed",
)  # fmt: skip
STAGE = without_comments(StructType([ATTEMPTS[name] for name in _STAGE_ORDER]))
assert sorted(STAGE.fieldNames()) == sorted(ATTEMPTS.fieldNames()[1:]), "STAGE != attempts"
# The same as Arrow: the event-by-event stage hands Spark Arrow record batches.
STAGE_ARROW = to_arrow_schema(STAGE)

# A capacity plan (retrysim plan): one row per sweep point and group. Its run_id is the plan's
# id; each point is a run of its own (with replications, runs <point_run_id>-r<k>; a plan run
# again with --replace names its runs <plan-id>-p<k>-e<n>, retrysim.planning.plans).
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
    ("run_id", StringType(), "the plan's id (the Delta partition)"),
    ("point", IntegerType(), "the plan point's number k, 1-based"),
    (
        "point_run_id",
        StringType(),
        "the point's run id, <plan-id>-p<k> (-e<n> after it in a replacing n-th execution; its "
        "replications: <point_run_id>-r<j>)",
    ),
    _GROUP,
    ("settings_json", StringType(), "the point's settings of the swept keys, as JSON"),
    ("instances", IntegerType(), "the group's consumer instances at this point"),
    ("threads", IntegerType(), "consumer threads per instance at this point"),
    ("pool", IntegerType(), "the pool size, instances x threads"),
    *(
        (metric, DoubleType(), f"the summary's {metric}, the mean across the replications")
        for metric in PLAN_METRICS
    ),
    (
        "targets_json",
        StringType(),
        "the targets that apply to the group: limits by column, as JSON",
    ),
    ("replications", IntegerType(), "the replications the point ran"),
    # the share of replications that must meet every target, and the share that did
    (
        "confidence",
        DoubleType(),
        "the share of replications that must meet every target (null without targets)",
    ),
    (
        "meets_targets_share",
        DoubleType(),
        "the share of replications that met every target (null without targets)",
    ),
    (
        "meets_targets",
        BooleanType(),
        "whether the point meets the targets: meets_targets_share >= confidence",
    ),
    ("failed_targets", StringType(), "the targets some replication missed, comma-separated"),
    (
        "recommended",
        BooleanType(),
        "whether this point is the recommended pool for its group and case",
    ),
    (
        "binding_target",
        StringType(),
        "of the recommended point: the targets the next smaller pool swept misses (none when "
        "the smallest pool meets them all)",
    ),
    *(
        (
            f"{metric}_ci_{end}",
            DoubleType(),
            f"the {end} end of the 95 % interval of the mean {metric} (null for one replication)",
        )
        for metric in PLAN_METRICS
        for end in ("low", "high")
    ),
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
# A conformance run (retrysim conformance): one row per scenario, group and figure compared
# with a real broker (docs/conformance.md); its run_id is the conformance run's.
CONFORMANCE = nullable_schema(
    ("run_id", StringType(), "the conformance run's id (the Delta partition)"),
    ("scenario", StringType(), "the scenario's name"),
    _GROUP,
    ("figure", StringType(), "what is compared (docs/conformance.md, The figures)"),
    ("retrysim", DoubleType(), "retrysim's value (a per-message figure: 0 mismatches)"),
    ("broker", DoubleType(), "the broker's value (a per-message figure: its mismatches)"),
    ("tolerance", DoubleType(), "how far the two may differ (0: exactly equal)"),
    ("within", BooleanType(), "whether the two are within the tolerance"),
)
# The broker's deliveries of a conformance run, as the harness recorded them.
BROKER_DELIVERIES = nullable_schema(
    ("run_id", StringType(), "the conformance run's id (the Delta partition)"),
    _GROUP,
    _MSG_ID,
    ("delivery", IntegerType(), "the delivery's number for its message, 1-based"),
    ("reconsume_times", IntegerType(), "the reconsumeTimes the client saw"),
    ("topic", StringType(), "the topic it was read from (a retry: %RETRY%<group>)"),
    ("queue_id", IntegerType(), "the queue it was read from"),
    ("instance", IntegerType(), "the consumer instance (0-based)"),
    ("thread", StringType(), "the consume thread"),
    (
        "stored_ms",
        LongType(),
        "when the broker stored the copy delivered, ms after production "
        "began: when it became Ready",
    ),
    ("start_ms", LongType(), "when the listener's work began, ms after production began"),
    ("end_ms", LongType(), "when the listener returned, ms after production began"),
    ("outcome", StringType(), "what the listener did (the outcome retrysim drew)"),
)
# A run laid over production metrics (retrysim compare): one row per quantity compared;
# its run_id is the run's.
COMPARISON = nullable_schema(
    ("run_id", StringType(), "the run compared (the Delta partition)"),
    _GROUP,
    ("quantity", StringType(), "what is compared (docs/metrics.md): lag, deliveries, retries, ..."),
    ("series", StringType(), "the observed series it was read from, and their files"),
    ("points", IntegerType(), "the samples that met a bucket of the run"),
    ("nmae", DoubleType(), "mean |simulated - observed| / mean |observed| (null: observed all 0)"),
    ("observed_peak", DoubleType(), "the observed series' largest value"),
    ("simulated_peak", DoubleType(), "the run's largest value over the same samples"),
    ("peak_error", DoubleType(), "(simulated_peak - observed_peak) / observed_peak"),
    ("observed_peak_ts", TimestampType(), "when the observed peak was sampled"),
    ("simulated_peak_ts", TimestampType(), "the end of the run's peak bucket, on its clock"),
    ("peak_shift_s", DoubleType(), "simulated_peak_ts - observed_peak_ts, in seconds"),
)
# Each observed sample beside the run's bucket that ends with it: what the run report draws
# over the run's own series.
OBSERVED = nullable_schema(
    ("run_id", StringType(), "the run compared (the Delta partition)"),
    _GROUP,
    ("quantity", StringType(), "as in comparison"),
    ("at_ts", TimestampType(), "the sample's time"),
    _BUCKET_START,
    ("observed", DoubleType(), "the observed value (a rate: per second over the interval)"),
    ("simulated", DoubleType(), "the run's value in the bucket ending at the sample"),
)
# Every table a sink writes and a reader reads: the eight tables of a run, plans, and the
# conformance runs' two.
ALL_SCHEMAS: dict[str, StructType] = {
    **SCHEMAS,
    "plan": PLAN,
    "conformance": CONFORMANCE,
    "broker_deliveries": BROKER_DELIVERIES,
    "comparison": COMPARISON,
    "observed": OBSERVED,
}
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
    Python worker when the plan runs (a run's first one is slow to start, on the critical
    path of staging); many rows as literals make a plan slow to analyse."""
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
    ``createDataFrame`` sends local rows through a Python worker, and a run's first one is
    slow to start, on the critical path of staging."""
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
