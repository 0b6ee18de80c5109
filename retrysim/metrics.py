"""Load series, dead letters and summaries, computed from staged attempts.

Each staged attempt is one delivery with everything that happened to it, so every count and
gauge of the ``load`` table is a sum of per-delivery contributions per time bucket:

* counts (deliveries, commits, DLQ moves, commitlog writes, ...) land in the bucket of their
  moment;
* gauges (inflight, waiting_retry, ready_backlog, the schedule backlog per delay level) are
  the number of messages in that state at the *end* of each bucket: +1 in the bucket where
  an interval starts, -1 where it ends, and a running sum over buckets;
* busy thread time is split exactly across the buckets a consume request spans;
* the oldest Ready message's age at a bucket's end ``t`` is ``t - min(ready_ms)`` over the
  deliveries Ready at ``t`` (ready before ``t``, started at or after it): a suffix minimum
  over start buckets, so no delivery is exploded over the buckets it waits through.

Percentiles are exact (Spark's ``percentile``), not ``percentile_approx``: the approximate
sketch depends on how rows are merged across partitions, and the same scenario must give the
same tables on any cluster.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from retrysim import limits
from retrysim.config import Scenario
from retrysim.policy import (
    COMMIT,
    DISCARD,
    DLQ,
    READY_PUBLISHED,
    READY_REPLAYED,
    READY_RETRY_DUE,
    WAITING_RETRY,
)
from retrysim.tables import DEAD_LETTERS, LOAD, SUMMARY, data_schema, select_schema

_PERCENTILES = (0.5, 0.95, 0.99)
_COUNTS = (
    "deliveries",
    "first_deliveries",
    "retries",
    "commits",
    "dlq",
    "discards",
    "commitlog_writes",
    "replays",
)
_GAUGES = ("inflight", "waiting_retry", "ready_backlog")


def _flag(condition: Column) -> Column:
    return F.when(condition, F.lit(1)).otherwise(F.lit(0)).cast("long")


def _literal_map(values: dict[str, object]) -> Column:
    return F.create_map(*[x for key, value in values.items() for x in (F.lit(key), F.lit(value))])


def groups_df(spark: SparkSession, scenario: Scenario) -> DataFrame:
    """One row per group: message count, size, source topic, pool size, delay levels."""
    rows = [
        (
            g.name,
            g.source_topic,
            g.workload.messages,
            g.workload.size_bytes,
            g.consumers.pool_size,
            len(scenario.broker.message_delay_level) if g.flavor == "rocketmq4.concurrently" else 0,
        )
        for g in scenario.groups
    ]
    return spark.createDataFrame(
        rows,
        "group string, origin_topic string, messages long, size_bytes long, pool long, levels int",
    )


def dead_letters_from_attempts(attempts: DataFrame, scenario: Scenario) -> DataFrame:
    """One row per move to the DLQ, with the replay that re-sent it, if any."""
    origin = _literal_map({g.name: g.source_topic for g in scenario.groups})
    replays = attempts.where(F.col("ready_reason") == F.lit(READY_REPLAYED)).select(
        "group", "msg_id", (F.col("delivery") - 1).alias("delivery"),
        F.col("ready_ms").alias("replayed_at_ms"),
    )  # fmt: skip
    dead = attempts.where(F.col("result_state") == F.lit(DLQ)).select(
        "group",
        "msg_id",
        "delivery",
        F.coalesce(F.col("leave_topic"), F.col("end_topic")).alias("dlq_topic"),
        F.col("settled_ms").alias("dlq_at_ms"),
        F.col("delivery").alias("deliveries"),
        origin[F.col("group")].alias("origin_topic"),
    )
    return select_schema(
        dead.join(replays, ["group", "msg_id", "delivery"], "left"), data_schema(DEAD_LETTERS)
    )


def _events(attempts: DataFrame) -> DataFrame:
    """Per-delivery contributions: (at_ms, kind, amount[, level]) as exploded structs."""
    state, reason = F.col("result_state"), F.col("ready_reason")
    start, ready, end, settled = (
        F.col(c) for c in ("start_ms", "ready_ms", "end_ms", "settled_ms")
    )
    started = start.isNotNull()
    waits_retry = F.col("end_state") == F.lit(WAITING_RETRY)
    wr_until = F.coalesce(F.col("next_ready_ms"), settled)
    scheduled = F.col("end_topic") == F.lit(limits.SCHEDULE_TOPIC)
    writes = _flag(reason.isin(READY_PUBLISHED, READY_REPLAYED, READY_RETRY_DUE))

    def event(when: Column, at: Column, kind: str, amount: Column | int = 1,
              level: Column | None = None) -> Column:  # fmt: skip
        value = amount if isinstance(amount, Column) else F.lit(amount)
        return F.when(
            when,
            F.struct(
                at.cast("long").alias("at_ms"),
                F.lit(kind).alias("kind"),
                value.cast("long").alias("amount"),
                (level if level is not None else F.lit(None)).cast("int").alias("level"),
            ),
        )

    delivered = F.col("delivery")
    return (
        attempts.select(
            "group",
            F.explode(
                F.array(
                    event(started, start, "deliveries"),
                    event(started & (delivered == 1), start, "first_deliveries"),
                    event(
                        started & ~reason.isin(READY_PUBLISHED, READY_REPLAYED), start, "retries"
                    ),
                    event(reason == F.lit(READY_REPLAYED), ready, "replays"),
                    event(state == F.lit(COMMIT), settled, "commits"),
                    event(state == F.lit(DLQ), settled, "dlq"),
                    event(state == F.lit(DISCARD), settled, "discards"),
                    event(writes == 1, ready, "commitlog_writes"),
                    event(waits_retry & scheduled, end, "commitlog_writes"),
                    event(state == F.lit(DLQ), settled, "commitlog_writes"),
                    event(started, start, "inflight"),
                    event(F.col("end_state").isNotNull(), end, "inflight", -1),
                    event(waits_retry, end, "waiting_retry"),
                    event(waits_retry & wr_until.isNotNull(), wr_until, "waiting_retry", -1),
                    event(F.lit(True), ready, "ready_backlog"),
                    event(started, start, "ready_backlog", -1),
                    event(waits_retry & scheduled, end, "schedule", 1, F.col("delay_level")),
                    event(
                        waits_retry & scheduled,
                        F.col("next_ready_ms"),
                        "schedule",
                        -1,
                        F.col("delay_level"),
                    ),
                )
            ).alias("e"),
        )
        .where(F.col("e").isNotNull() & F.col("e.at_ms").isNotNull())
        .select("group", "e.*")
    )


def _busy_ms(attempts: DataFrame, bucket_ms: int) -> DataFrame:
    """Thread-milliseconds busy per bucket, split exactly across the buckets a request spans
    (a batch member carries its share of the batch's time)."""
    bucket = F.lit(bucket_ms)
    busy = attempts.where(F.col("start_ms").isNotNull() & (F.col("processing_ms") > 0)).select(
        "group",
        F.col("start_ms").alias("s"),
        (F.col("start_ms") + F.col("processing_ms")).alias("e"),
        (F.lit(1.0) / F.col("batch_size")).alias("share"),
    )
    first, last = F.floor(F.col("s") / bucket), F.floor((F.col("e") - 1) / bucket)
    spread = busy.withColumn("bucket", F.explode(F.sequence(first, last)))
    overlap = F.least(F.col("e"), (F.col("bucket") + 1) * bucket) - F.greatest(
        F.col("s"), F.col("bucket") * bucket
    )
    return spread.groupBy("group", "bucket").agg(
        F.sum(overlap * F.col("share")).alias("busy_thread_ms")
    )


def _oldest_ready(attempts: DataFrame, bucket_ms: int, buckets: int) -> DataFrame:
    """min(ready_ms) per start bucket of the deliveries that waited in Ready; a delivery never
    started (still Ready at the horizon) counts as starting after the last bucket, so the
    suffix minimum carries it through every bucket from its Ready moment to the end."""
    started_in = F.floor(F.col("start_ms") / F.lit(bucket_ms))
    start_bucket = F.coalesce(started_in, F.lit(buckets)).cast("long")
    waited = attempts.where(
        F.col("start_ms").isNull() | (F.col("start_ms") > F.col("ready_ms"))
    ).select("group", start_bucket.alias("start_bucket"), "ready_ms")
    return waited.groupBy("group", "start_bucket").agg(F.min("ready_ms").alias("min_ready"))


def load_from_attempts(spark: SparkSession, attempts: DataFrame, scenario: Scenario) -> DataFrame:
    """The ``load`` table: per group and bucket, counts, gauges at the bucket's end, the
    schedule backlog per delay level, thread use and the oldest Ready message's age."""
    bucket_ms = scenario.load_bucket
    buckets = -(-scenario.horizon // bucket_ms)
    bucket = F.floor(F.col("at_ms") / F.lit(bucket_ms))
    events = _events(attempts).withColumn("bucket", bucket).where(F.col("bucket") < buckets)
    names = (*_COUNTS, *_GAUGES)
    per_bucket = events.groupBy("group", "bucket").agg(
        *[F.sum(F.when(F.col("kind") == F.lit(n), F.col("amount"))).alias(n) for n in names]
    )
    groups = groups_df(spark, scenario)
    grid = groups.crossJoin(
        spark.range(0, buckets, numPartitions=1).withColumnRenamed("id", "bucket")
    )
    upto = (
        Window.partitionBy("group")
        .orderBy("bucket")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    after = (
        Window.partitionBy("group")
        .orderBy(F.col("bucket").desc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    oldest = _oldest_ready(attempts, bucket_ms, buckets).select(
        "group", (F.col("start_bucket") - 1).alias("bucket"), "min_ready"
    )
    filled = (
        grid.join(per_bucket, ["group", "bucket"], "left")
        .join(_busy_ms(attempts, bucket_ms), ["group", "bucket"], "left")
        .join(oldest, ["group", "bucket"], "left")
        .join(_schedule_backlog(events, groups, buckets), ["group", "bucket"], "left")
        .fillna(0, subset=[*names, "busy_thread_ms"])
    )
    bucket_end = (F.col("bucket") + 1) * F.lit(bucket_ms)
    oldest_ready = F.min("min_ready").over(after)
    return select_schema(
        filled.withColumns(
            {
                "bucket_start_ms": F.col("bucket") * F.lit(bucket_ms),
                "bucket_ms": F.lit(bucket_ms),
                **{gauge: F.sum(gauge).over(upto) for gauge in _GAUGES},
                "commitlog_bytes": F.col("commitlog_writes") * F.col("size_bytes"),
                "utilization": F.col("busy_thread_ms") / (F.col("pool") * F.lit(bucket_ms)),
                "oldest_ready_age_ms": F.when(
                    oldest_ready < bucket_end, bucket_end - oldest_ready
                ).otherwise(F.lit(0)),
                "schedule_backlog": F.coalesce(
                    F.col("schedule_backlog"), F.array().cast("array<bigint>")
                ),
            }
        ),
        data_schema(LOAD),
    )


def _schedule_backlog(events: DataFrame, groups: DataFrame, buckets: int) -> DataFrame:
    """Messages waiting in SCHEDULE_TOPIC_XXXX per delay level at each bucket's end, as an
    array indexed by level - 1 (4.x concurrent groups; empty for the others)."""
    deltas = (
        events.where(F.col("kind") == F.lit("schedule"))
        .groupBy("group", "level", "bucket")
        .agg(F.sum("amount").alias("delta"))
    )
    spark = events.sparkSession
    grid = (
        groups.where(F.col("levels") > 0)
        .select("group", F.explode(F.sequence(F.lit(1), F.col("levels"))).alias("level"))
        .crossJoin(spark.range(0, buckets, numPartitions=1).withColumnRenamed("id", "bucket"))
    )
    upto = (
        Window.partitionBy("group", "level")
        .orderBy("bucket")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    levels = (
        grid.join(deltas, ["group", "level", "bucket"], "left")
        .fillna(0, subset=["delta"])
        .withColumn("backlog", F.sum("delta").over(upto))
    )
    return levels.groupBy("group", "bucket").agg(
        F.transform(
            F.array_sort(F.collect_list(F.struct("level", "backlog"))), lambda x: x["backlog"]
        ).alias("schedule_backlog")
    )


def summary_from(
    spark: SparkSession,
    attempts: DataFrame,
    load: DataFrame,
    scenario: Scenario,
    engines: dict[str, str],
) -> DataFrame:
    """The ``summary`` table: one row per group, from staged attempts and the load table."""
    state, reason = F.col("result_state"), F.col("ready_reason")
    shares = ", ".join(str(p) for p in _PERCENTILES)
    per_group = attempts.groupBy("group").agg(
        F.count(F.col("start_ms")).alias("deliveries"),
        F.sum(
            _flag(F.col("start_ms").isNotNull() & ~reason.isin(READY_PUBLISHED, READY_REPLAYED))
        ).alias("retries"),
        F.sum(_flag(state == F.lit(COMMIT))).alias("commits"),
        F.sum(_flag(state == F.lit(DLQ)) - _flag(reason == F.lit(READY_REPLAYED))).alias("dlq"),
        F.sum(_flag(state == F.lit(DISCARD))).alias("discards"),
        F.sum(_flag(reason == F.lit(READY_REPLAYED))).alias("replayed"),
        F.expr(
            f"percentile(CASE WHEN result_state = '{COMMIT}' THEN settled_ms - born_ms END, "
            f"array({shares}))"
        ).alias("ttc"),
        F.expr(
            f"percentile(CASE WHEN result_state = '{DLQ}' THEN settled_ms - born_ms END, "
            f"array({shares}))"
        ).alias("ttd"),
    )
    from_load = load.groupBy("group").agg(
        F.sum("commitlog_writes").alias("commitlog_writes"),
        F.max("ready_backlog").alias("max_ready_backlog"),
        F.max("waiting_retry").alias("max_waiting_retry"),
        F.max("utilization").alias("peak_utilization"),
    )
    counted = ("deliveries", "retries", "commits", "dlq", "discards", "replayed")
    joined = (
        groups_df(spark, scenario)
        .join(per_group, on="group", how="left")
        .join(from_load, on="group", how="left")
        .fillna(0, subset=[*counted, "commitlog_writes", "max_ready_backlog", "max_waiting_retry"])
    )
    columns = {
        "pending": F.col("messages") - F.col("commits") - F.col("dlq") - F.col("discards"),
        "amplification": F.col("deliveries") / F.col("messages"),
        "write_amplification": F.col("commitlog_writes") / F.col("messages"),
        "engine": _literal_map(engines)[F.col("group")],
    }
    for index, share in enumerate(_PERCENTILES):
        label = f"p{round(share * 100)}"
        columns[f"{label}_time_to_commit_ms"] = F.col("ttc")[index]
        columns[f"{label}_time_to_dlq_ms"] = F.col("ttd")[index]
    return select_schema(joined.withColumns(columns), data_schema(SUMMARY))
