"""Exact peaks: each gauge's largest value within a load bucket, from events, not samples.

A gauge (messages Ready, Inflight, WaitingRetry, in the schedule topic, threads busy) only
changes at the moments of a delivery's events. All events of one millisecond happen
together, so a gauge is a step function whose value on ``[m, next event)`` is the sum of
every change at or before ``m``. Its largest value within a bucket is the value it enters
the bucket with (unless a change lands on the bucket's first millisecond) or one of its
values after a change inside the bucket. The changes are summed per millisecond and the
running sum is taken per (group, gauge, bucket): the work splits by bucket, never one
window over a whole group, and the value a bucket starts with is a running sum over the
few bucket rows.

The same pass counts deliveries, retries and commit-log writes per second, for the peak
rates, and the longest wait of a delivery that left Ready within each bucket, for the
oldest Ready message's largest age.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from retrysim.model.states import (
    DLQ,
    READY_PUBLISHED,
    READY_REPLAYED,
    READY_RETRY_DUE,
    WAITING_RETRY,
)
from retrysim.scenario import limits
from retrysim.scenario.spec import Scenario

# Threads busy are counted in units of 1/THREAD_UNITS of a thread, so that a batch member's
# share (1/batch_size of its request's thread) adds up exactly as an integer.
THREAD_UNITS = 10**12
GAUGES = ("ready_backlog", "inflight", "waiting_retry", "schedule", "threads_busy")
RATES = ("deliveries", "retries", "commitlog_writes")
WAIT = "ready_wait"
# The schedule gauge per delay level has level >= 1; level 0 is all levels together.
ALL_LEVELS = 0


def _change(when: Column, at: Column, kind: str, amount: Column, level: Column | None = None):
    return F.when(
        when & at.isNotNull(),
        F.struct(
            F.lit(kind).alias("kind"),
            (level if level is not None else F.lit(ALL_LEVELS)).cast("int").alias("level"),
            at.cast("long").alias("t"),
            amount.cast("long").alias("amount"),
        ),
    )


def _changes(attempts: DataFrame) -> list[Column]:
    """Every change an attempt makes: (kind, level, t, amount). Gauges change at their
    millisecond; rates count at the start of their second; a wait is recorded at the last
    millisecond the delivery was Ready."""
    c = F.col
    one = F.lit(1)
    started = c("start_ms").isNotNull()
    reason = c("ready_reason")
    waits_retry = c("end_state") == F.lit(WAITING_RETRY)
    scheduled = waits_retry & (c("end_topic") == F.lit(limits.SCHEDULE_TOPIC))
    busy = started & (c("processing_ms") > 0)
    share = F.floor(F.lit(THREAD_UNITS) / c("batch_size"))
    waited_until = F.coalesce(c("next_ready_ms"), c("settled_ms"))

    def second(at: Column) -> Column:
        return F.floor(at / F.lit(1000)) * F.lit(1000)

    return [
        _change(F.lit(True), c("ready_ms"), "ready_backlog", one),
        _change(started, c("start_ms"), "ready_backlog", -one),
        _change(started, c("start_ms"), "inflight", one),
        _change(c("end_state").isNotNull(), c("end_ms"), "inflight", -one),
        _change(waits_retry, c("end_ms"), "waiting_retry", one),
        _change(waits_retry, waited_until, "waiting_retry", -one),
        _change(scheduled, c("end_ms"), "schedule", one),
        _change(scheduled, c("next_ready_ms"), "schedule", -one),
        _change(scheduled, c("end_ms"), "schedule", one, c("delay_level")),
        _change(scheduled, c("next_ready_ms"), "schedule", -one, c("delay_level")),
        _change(busy, c("start_ms"), "threads_busy", share),
        _change(busy, c("start_ms") + c("processing_ms"), "threads_busy", -share),
        _change(started, second(c("start_ms")), "deliveries", one),
        _change(
            started & ~reason.isin(READY_PUBLISHED, READY_REPLAYED),
            second(c("start_ms")),
            "retries",
            one,
        ),
        _change(
            reason.isin(READY_PUBLISHED, READY_REPLAYED, READY_RETRY_DUE),
            second(c("ready_ms")),
            "commitlog_writes",
            one,
        ),
        _change(scheduled, second(c("end_ms")), "commitlog_writes", one),
        _change(c("result_state") == F.lit(DLQ), second(c("settled_ms")), "commitlog_writes", one),
        _change(
            started & (c("start_ms") > c("ready_ms")),
            c("start_ms") - one,
            WAIT,
            c("start_ms") - c("ready_ms"),
        ),
    ]


def bucket_changes(attempts: DataFrame, scenario: Scenario) -> DataFrame:
    """Per (group, kind, level, bucket) with any change before the horizon: ``total`` (the
    gauge's net change, or the count), ``rise`` (the gauge's largest value in the bucket
    minus the value it entered with), ``busiest`` (the largest count of one second) and
    ``longest`` (the longest wait). Held in executor memory: a few rows per bucket."""
    bucket_ms = scenario.load_bucket
    per_moment = (
        attempts.select("group", F.explode(F.array(*_changes(attempts))).alias("e"))
        .where(F.col("e").isNotNull() & (F.col("e.t") < F.lit(scenario.horizon)))
        .select("group", "e.*")
        .groupBy("group", "kind", "level", "t")
        .agg(F.sum("amount").alias("delta"), F.max("amount").alias("top"))
        .withColumn("bucket", F.floor(F.col("t") / F.lit(bucket_ms)))
    )
    keys = ["group", "kind", "level", "bucket"]
    running = F.sum("delta").over(
        Window.partitionBy(*keys)
        .orderBy("t")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    first_ms = F.col("bucket") * F.lit(bucket_ms)
    return (
        per_moment.withColumn("level_after", running)
        .groupBy(*keys)
        .agg(
            F.sum("delta").alias("total"),
            F.max("level_after").alias("highest"),
            F.min("t").alias("first_t"),
            F.max("delta").alias("busiest"),
            F.max("top").alias("longest"),
        )
        .withColumn(
            "rise",
            F.when(F.col("first_t") > first_ms, F.greatest(F.col("highest"), F.lit(0))).otherwise(
                F.col("highest")
            ),
        )
        .drop("highest", "first_t")
        .localCheckpoint()
    )


def gauge_columns(changes: DataFrame, kind: str, level: bool = False) -> DataFrame:
    """One gauge's ``total`` and ``rise`` per (group[, level], bucket), named after it."""
    keys = ["group", "level", "bucket"] if level else ["group", "bucket"]
    rows = changes.where(F.col("kind") == F.lit(kind))
    if not level:
        rows = rows.where(F.col("level") == F.lit(ALL_LEVELS))
    return rows.select(
        *keys, F.col("total").alias(f"{kind}_total"), F.col("rise").alias(f"{kind}_rise")
    )


def bucket_maximum(end: Column, total: Column, rise: Column) -> Column:
    """A gauge's largest value in a bucket from its value at the bucket's end, the bucket's
    net change and its rise: the value it entered with is ``end - total``."""
    return F.when(rise.isNull(), end).otherwise(end - total + rise)


def run_maxima(changes: DataFrame) -> DataFrame:
    """Per group, the run's exact peaks: each gauge's largest value (the schedule topic all
    levels together; threads busy in THREAD_UNITS), the busiest second of each rate, and
    the longest wait in Ready. A bucket without changes keeps the value it entered with,
    which the bucket before it reached, so the buckets with changes are enough."""
    gauges = changes.where(F.col("kind").isin(*GAUGES) & (F.col("level") == F.lit(ALL_LEVELS)))
    end = F.sum("total").over(
        Window.partitionBy("group", "kind")
        .orderBy("bucket")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    peaks = gauges.withColumn("peak", bucket_maximum(end, F.col("total"), F.col("rise")))
    others = changes.where(~F.col("kind").isin(*GAUGES)).withColumn(
        "peak", F.when(F.col("kind") == F.lit(WAIT), F.col("longest")).otherwise(F.col("busiest"))
    )
    return (
        peaks.select("group", "kind", "peak")
        .unionByName(others.select("group", "kind", "peak"))
        .groupBy("group")
        .pivot("kind", [*GAUGES, *RATES, WAIT])
        .agg(F.max("peak"))
    )
