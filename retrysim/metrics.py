"""Load series, dead letters and summaries, computed from staged attempts and transitions.

Gauges (inflight, waiting_retry, ready_backlog) are the number of messages in that state at
the *end* of each bucket: every transition adds one to the state it enters and takes one
from the state it leaves, and a running sum over the buckets gives the level. The per-bucket
table is small (groups × buckets), so the running sum is a cheap window.

Commitlog writes follow the broker: the original publish, and for each broker-side retry one
write to SCHEDULE_TOPIC_XXXX (at WaitingRetry) and one to %RETRY%group (when it is due),
plus the write to %DLQ%group.

Percentiles are exact (Spark's ``percentile``), not ``percentile_approx``: the approximate
sketch depends on how rows are merged across partitions, and the same scenario must give the
same tables on any cluster.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from retrysim import limits
from retrysim.config import Scenario
from retrysim.policy import COMMIT, DISCARD, DLQ, INFLIGHT, READY, WAITING_RETRY
from retrysim.tables import DEAD_LETTERS, LOAD, SUMMARY, data_schema, select_schema

_PERCENTILES = (0.5, 0.95, 0.99)
_ENDS = (COMMIT, WAITING_RETRY, DLQ, DISCARD)


def _group_literal_map(values: dict[str, object]) -> Column:
    pairs = []
    for key, value in values.items():
        pairs += [F.lit(key), F.lit(value)]
    return F.create_map(*pairs)


def groups_df(spark: SparkSession, scenario: Scenario) -> DataFrame:
    """One row per group with its message count, size and source topic (tiny, literal)."""
    rows = [
        (g.name, g.source_topic, g.workload.messages, g.workload.size_bytes)
        for g in scenario.groups
    ]
    return spark.createDataFrame(
        rows, "group string, origin_topic string, messages long, size_bytes long"
    )


def dead_letters_from_attempts(attempts: DataFrame, scenario: Scenario) -> DataFrame:
    origin = _group_literal_map({g.name: g.source_topic for g in scenario.groups})
    return select_schema(
        attempts.where(F.col("result_state") == F.lit(DLQ)).select(
            "group",
            "msg_id",
            F.col("to_topic").alias("dlq_topic"),
            F.col("end_ms").alias("dlq_at_ms"),
            F.col("delivery").alias("deliveries"),
            origin[F.col("group")].alias("origin_topic"),
        ),
        data_schema(DEAD_LETTERS),
    )


def _flag(condition: Column) -> Column:
    return condition.cast("long")


def load_from_transitions(
    spark: SparkSession, transitions: DataFrame, scenario: Scenario
) -> DataFrame:
    """The ``load`` table: counts per bucket and gauge levels at each bucket's end."""
    bucket_ms = scenario.load_bucket
    state, delivery, topic = F.col("state"), F.col("delivery"), F.col("topic")
    is_retry_ready = (state == F.lit(READY)) & (delivery > 1)
    writes = (
        ((state == F.lit(READY)) & (delivery == 1))
        | ((state == F.lit(WAITING_RETRY)) & (topic == F.lit(limits.SCHEDULE_TOPIC)))
        | (is_retry_ready & topic.startswith(limits.RETRY_TOPIC_PREFIX))
        | (state == F.lit(DLQ))
    )
    per_bucket = (
        transitions.withColumn("bucket", F.floor(F.col("at_ms") / F.lit(bucket_ms)))
        .groupBy("group", "bucket")
        .agg(
            F.sum(_flag(state == F.lit(INFLIGHT))).alias("deliveries"),
            F.sum(_flag((state == F.lit(INFLIGHT)) & (delivery == 1))).alias("first_deliveries"),
            F.sum(_flag((state == F.lit(INFLIGHT)) & (delivery > 1))).alias("retries"),
            F.sum(_flag(state == F.lit(COMMIT))).alias("commits"),
            F.sum(_flag(state == F.lit(DLQ))).alias("dlq"),
            F.sum(_flag(state == F.lit(DISCARD))).alias("discards"),
            F.sum(_flag(state == F.lit(INFLIGHT)) - _flag(state.isin(*_ENDS))).alias("d_inflight"),
            F.sum(_flag(state == F.lit(WAITING_RETRY)) - _flag(is_retry_ready)).alias(
                "d_waiting_retry"
            ),
            F.sum(_flag(state == F.lit(READY)) - _flag(state == F.lit(INFLIGHT))).alias("d_ready"),
            F.sum(_flag(writes)).alias("commitlog_writes"),
        )
    )
    buckets = -(-scenario.horizon // bucket_ms)
    grid = groups_df(spark, scenario).crossJoin(
        spark.range(0, buckets, numPartitions=1).withColumnRenamed("id", "bucket")
    )
    upto_now = (
        Window.partitionBy("group")
        .orderBy("bucket")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    counts = ("deliveries", "first_deliveries", "retries", "commits", "dlq", "discards")
    deltas = ("d_inflight", "d_waiting_retry", "d_ready", "commitlog_writes")
    filled = grid.join(per_bucket, on=["group", "bucket"], how="left").fillna(
        0, subset=[*counts, *deltas]
    )
    return select_schema(
        filled.withColumn("bucket_start_ms", F.col("bucket") * F.lit(bucket_ms))
        .withColumn("bucket_ms", F.lit(bucket_ms))
        .withColumn("inflight", F.sum("d_inflight").over(upto_now))
        .withColumn("waiting_retry", F.sum("d_waiting_retry").over(upto_now))
        .withColumn("ready_backlog", F.sum("d_ready").over(upto_now))
        .withColumn("commitlog_bytes", F.col("commitlog_writes") * F.col("size_bytes")),
        data_schema(LOAD),
    )


def summary_from(
    spark: SparkSession, attempts: DataFrame, load: DataFrame, scenario: Scenario
) -> DataFrame:
    """The ``summary`` table: one row per group, from staged attempts and the load table."""
    state = F.col("result_state")
    shares = ", ".join(str(p) for p in _PERCENTILES)
    per_group = attempts.groupBy("group").agg(
        F.count(F.lit(1)).alias("deliveries"),
        F.sum(_flag(F.col("delivery") > 1)).alias("retries"),
        F.sum(_flag(state == F.lit(COMMIT))).alias("commits"),
        F.sum(_flag(state == F.lit(DLQ))).alias("dlq"),
        F.sum(_flag(state == F.lit(DISCARD))).alias("discards"),
        F.expr(
            f"percentile(CASE WHEN result_state = '{COMMIT}' THEN end_ms - born_ms END, "
            f"array({shares}))"
        ).alias("ttc"),
        F.expr(
            f"percentile(CASE WHEN result_state = '{DLQ}' THEN end_ms - born_ms END, "
            f"array({shares}))"
        ).alias("ttd"),
    )
    writes = load.groupBy("group").agg(F.sum("commitlog_writes").alias("commitlog_writes"))
    joined = (
        groups_df(spark, scenario)
        .join(per_group, on="group", how="left")
        .join(writes, on="group", how="left")
        .fillna(0, subset=["deliveries", "retries", "commits", "dlq", "discards"])
        .fillna(0, subset=["commitlog_writes"])
    )
    columns = {
        "pending": F.col("messages") - F.col("commits") - F.col("dlq") - F.col("discards"),
        "amplification": F.col("deliveries") / F.col("messages"),
        "write_amplification": F.col("commitlog_writes") / F.col("messages"),
    }
    for index, share in enumerate(_PERCENTILES):
        label = f"p{round(share * 100)}"
        columns[f"{label}_time_to_commit_ms"] = F.col("ttc")[index]
        columns[f"{label}_time_to_dlq_ms"] = F.col("ttd")[index]
    return select_schema(joined.withColumns(columns), data_schema(SUMMARY))
