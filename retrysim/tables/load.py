"""The ``load`` table: counts and gauges per group and time bucket, from staged attempts.

Each staged attempt is one delivery with everything that happened to it, so every count and
gauge of the ``load`` table is a sum of per-delivery contributions per time bucket:

* counts (deliveries, commits, DLQ moves, commitlog writes, ...) land in the bucket of their
  moment;
* gauges (inflight, waiting_retry, ready_backlog, the schedule backlog per delay level) are
  the number of messages in that state at the *end* of each bucket: +1 in the bucket where
  an interval starts, -1 where it ends, and a running sum over buckets; beside each, its
  exact largest value within the bucket (``<gauge>_max``, :mod:`retrysim.tables.peaks`);
* busy thread time is split exactly across the buckets a consume request spans;
* the oldest Ready message's age at a bucket's end ``t`` is ``t - min(ready_ms)`` over the
  deliveries Ready at ``t`` (ready before ``t``, started at or after it): a suffix minimum
  over start buckets, so no delivery is exploded over the buckets it waits through.

"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from retrysim.model.states import (
    COMMIT,
    DISCARD,
    DLQ,
    READY_PUBLISHED,
    READY_REPLAYED,
    WAITING_RETRY,
)
from retrysim.scenario import limits
from retrysim.scenario.spec import Scenario
from retrysim.tables.commitlog_writes import write_times
from retrysim.tables.group_sums import ALL_LEVELS, RETRY_NUMBER_CAP, THREAD_UNITS, GroupSums
from retrysim.tables.groups import groups_df
from retrysim.tables.peaks import bucket_changes, bucket_maximum, with_known
from retrysim.tables.schemas import (
    LOAD,
    data_schema,
    select_schema,
)

if TYPE_CHECKING:  # pandas too: the compiled loop's workers import this and never load it
    import pandas as pd


LOAD_COUNTS = (
    "deliveries",
    "first_deliveries",
    "retries",
    "commits",
    "dlq",
    "discards",
    "commitlog_writes",
    "replays",
)
LOAD_GAUGES = ("inflight", "waiting_retry", "ready_backlog")
_COMPACT_WRITES = 8  # the position of b_writes in a compact row (group, 7 keys before it)


def _bucket_of(column: str, bucket_ms: int) -> Column:
    return F.floor(F.col(column) / F.lit(bucket_ms)).cast("long")


def _compact(attempts: DataFrame, scenario: Scenario) -> DataFrame:
    """Attempts grouped by everything the load table reads from them: which events a delivery
    has and the bucket of each; and by the retry a WaitingRetry attempt schedules, which the
    run's report counts (:func:`retries_by_level`). Deliveries that look alike in those
    respects add up, so the table has a few rows per bucket and kind of delivery, however
    many messages run; every later step of the load works on it, not on the attempts.

    Busy time is kept exact as integer sums of start and end per row, so splitting a request
    across the buckets it spans needs no per-delivery row either.
    """
    bucket_ms = scenario.load_bucket
    state, reason = F.col("result_state"), F.col("ready_reason")
    started = F.col("start_ms").isNotNull()
    waits_retry = F.col("end_state") == F.lit(WAITING_RETRY)
    scheduled = waits_retry & (F.col("end_topic") == F.lit(limits.SCHEDULE_TOPIC))
    busy = started & (F.col("processing_ms") > 0)
    busy_end = F.col("start_ms") + F.col("processing_ms")
    keys = {
        "started": started,
        "first": started & (F.col("delivery") == 1),
        "retry": started & ~reason.isin(READY_PUBLISHED, READY_REPLAYED),
        "replayed": reason == F.lit(READY_REPLAYED),
        "state": state,
        # Inflight ends at end_ms (for 5.x simple, when the message is visible again)
        "ended": F.col("end_ms").isNotNull(),
        "waits_retry": waits_retry,
        # the buckets of its commit-log writes (retrysim.tables.commitlog_writes), one per write
        "b_writes": F.array(*[F.floor(t / F.lit(bucket_ms)) for t in write_times(scenario)]),
        "level": F.when(scheduled, F.col("delay_level")),
        "b_ready": _bucket_of("ready_ms", bucket_ms),
        "b_start": _bucket_of("start_ms", bucket_ms),
        "b_end": _bucket_of("end_ms", bucket_ms),
        "b_settled": _bucket_of("settled_ms", bucket_ms),
        "b_wr_until": F.when(
            waits_retry,
            F.floor(F.coalesce(F.col("next_ready_ms"), F.col("settled_ms")) / F.lit(bucket_ms)),
        ).cast("long"),
        "b_busy_last": F.when(busy, F.floor((busy_end - 1) / F.lit(bucket_ms))).cast("long"),
        "batch_size": F.col("batch_size"),
        **_retry_columns(),
        # a 4.9 client's second send-back: its copy's state, WaitingRetry from its moment's
        # bucket until its retry's, at its level, or the DLQ or a discard
        "copy_state": F.col("copy_state"),
        "b_copy": _bucket_of("copy_ms", bucket_ms),
        "b_copy_until": _bucket_of("copy_ready_ms", bucket_ms),
        "copy_level": F.col("copy_delay_level"),
    }
    waited = F.col("start_ms").isNull() | (F.col("start_ms") > F.col("ready_ms"))
    return (
        attempts.select(
            "group",
            *[c.alias(n) for n, c in keys.items()],
            F.when(busy, F.col("start_ms")).alias("busy_start"),
            F.when(busy, busy_end).alias("busy_end"),
            F.when(waited, F.col("ready_ms")).alias("waited_ready"),
        )
        .groupBy("group", *keys)
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.sum("busy_start").alias("busy_start_sum"),
            F.sum("busy_end").alias("busy_end_sum"),
            F.min("waited_ready").alias("min_waited_ready"),
        )
    )


def _retry_columns() -> dict[str, Column]:
    """The retry a WaitingRetry attempt schedules: its delay level and its retry number
    (capped at RETRY_NUMBER_CAP); null for any other attempt."""
    # a retry: WaitingRetry with a next delivery, or (5.x simple) Inflight until visible
    waiting = F.col("next_ready_ms").isNotNull()
    retry = F.least(F.col("reconsume_times") + F.lit(1), F.lit(RETRY_NUMBER_CAP))
    return {
        "retry_level": F.when(waiting, F.col("delay_level")),
        "retry_number": F.when(waiting, retry),
    }


def retries_by_level(attempts: DataFrame, compact: DataFrame | None = None) -> pd.DataFrame:
    """Retries scheduled per group, delay level (4.x schedule topic; null for other retry
    paths) and retry number: a delivery that failed and waits for its next delivery is one
    retry. Counted from ``compact`` (:func:`compact_attempts`) when the caller holds it, so
    the report of a large run does not read every attempt again; only counts reach the
    driver."""
    counted = (
        compact
        if compact is not None
        else attempts.select(
            "group",
            *[c.alias(n) for n, c in _retry_columns().items()],
            F.col("copy_delay_level").alias("copy_level"),
            F.col("copy_state"),
        ).withColumn("n", F.lit(1))
    )
    # a 4.9 client's second copy waiting in the schedule topic is a retry too, the same one
    copies = counted.where(F.col("copy_state") == F.lit(WAITING_RETRY)).withColumn(
        "retry_level", F.col("copy_level")
    )
    return (
        counted.unionByName(copies)
        .where(F.col("retry_number").isNotNull())
        .groupBy(
            "group",
            F.col("retry_level").alias("delay_level"),
            F.col("retry_number").alias("retry"),
        )
        .agg(F.sum("n").alias("retries"))
        .orderBy("group", "retry", "delay_level")
        .toPandas()
    )


def _events(compact: DataFrame) -> DataFrame:
    """Contributions to the counts and gauges: (bucket, kind, amount[, level]) per compact row.

    Counts land in the bucket of their moment; a gauge gets +n where its interval starts and
    -n where it ends, and a running sum over buckets gives its value at each bucket's end.
    """
    state, n = F.col("state"), F.col("n")
    started, waits_retry = F.col("started"), F.col("waits_retry")
    scheduled = F.col("level").isNotNull()

    def event(
        when: Column, bucket: str, kind: str, sign: int = 1, level: str | None = None
    ) -> Column:
        return F.when(
            when & F.col(bucket).isNotNull(),
            F.struct(
                F.col(bucket).alias("bucket"),
                F.lit(kind).alias("kind"),
                (n * F.lit(sign)).alias("amount"),
                (F.col(level) if level else F.lit(None)).cast("int").alias("level"),
            ),
        )

    copy = F.col("copy_state")
    copied = copy == F.lit(WAITING_RETRY)

    # a small array over the few compact rows: the lambda's interpreted evaluation is cheap here
    writes = F.transform(
        F.col("b_writes"),
        lambda b: F.struct(
            b.cast("long").alias("bucket"),
            F.lit("commitlog_writes").alias("kind"),
            n.alias("amount"),
            F.lit(None).cast("int").alias("level"),
        ),
    )
    return (
        compact.select(
            "group",
            F.explode(
                F.concat(
                    F.array(
                        event(started, "b_start", "deliveries"),
                        event(F.col("first"), "b_start", "first_deliveries"),
                        event(F.col("retry"), "b_start", "retries"),
                        event(F.col("replayed"), "b_ready", "replays"),
                        event(state == F.lit(COMMIT), "b_settled", "commits"),
                        event(state == F.lit(DLQ), "b_settled", "dlq"),
                        event(state == F.lit(DISCARD), "b_settled", "discards"),
                        event(started, "b_start", "inflight"),
                        event(F.col("ended"), "b_end", "inflight", -1),
                        event(waits_retry, "b_end", "waiting_retry"),
                        event(waits_retry, "b_wr_until", "waiting_retry", -1),
                        event(F.lit(True), "b_ready", "ready_backlog"),
                        event(started, "b_start", "ready_backlog", -1),
                        event(scheduled, "b_end", "schedule", 1, level="level"),
                        event(scheduled, "b_wr_until", "schedule", -1, level="level"),
                        event(copy == F.lit(DLQ), "b_copy", "dlq"),
                        event(copy == F.lit(DISCARD), "b_copy", "discards"),
                        event(copied, "b_copy", "waiting_retry"),
                        event(copied, "b_copy_until", "waiting_retry", -1),
                        event(copied, "b_copy", "schedule", 1, level="copy_level"),
                        event(copied, "b_copy_until", "schedule", -1, level="copy_level"),
                    ),
                    writes,
                )
            ).alias("e"),
        )
        .where(F.col("e.bucket").isNotNull())  # a write the attempt does not make: no bucket
        .select("group", "e.*")
    )


def _busy_ms(compact: DataFrame, bucket_ms: int) -> DataFrame:
    """Thread-milliseconds busy per bucket, split exactly across the buckets a request spans
    (a batch member carries its share of the batch's time).

    A compact row holds ``n`` requests from bucket ``b1`` to ``b2`` with start and end sums
    ``S`` and ``E``: if ``b1 = b2`` they were busy ``E - S``; otherwise ``n (b1 + 1) B - S`` in
    ``b1``, ``E - n b2 B`` in ``b2`` and ``n B`` in each bucket between.
    """
    bucket = F.lit(bucket_ms)
    spans = compact.where(F.col("b_busy_last").isNotNull())
    b, b1, b2, n = F.col("bucket"), F.col("b_start"), F.col("b_busy_last"), F.col("n")
    starts, ends = F.col("busy_start_sum"), F.col("busy_end_sum")
    busy = (
        F.when(b1 == b2, ends - starts)
        .when(b == b1, n * (b1 + 1) * bucket - starts)
        .when(b == b2, ends - n * b2 * bucket)
        .otherwise(n * bucket)
    )
    return (
        spans.withColumn("bucket", F.explode(F.sequence(b1, b2)))
        .groupBy("group", "bucket")
        .agg(F.sum(busy.cast("double") / F.col("batch_size")).alias("busy_thread_ms"))
    )


def _oldest_ready(compact: DataFrame, buckets: int) -> DataFrame:
    """min(ready_ms) of the deliveries that waited in Ready, by the bucket they started in; a
    delivery never started (still Ready at the horizon) counts as starting in bucket
    ``buckets``, just after the last one, so the suffix minimum over ``start_bucket - 1``
    carries it through every bucket from its Ready moment to the end."""
    start_bucket = F.coalesce(F.col("b_start"), F.lit(buckets))
    return (
        compact.where(F.col("min_waited_ready").isNotNull())
        .groupBy("group", start_bucket.alias("start_bucket"))
        .agg(F.min("min_waited_ready").alias("min_ready"))
    )


def compact_attempts(
    attempts: DataFrame, scenario: Scenario, known: dict[str, GroupSums] | None = None
) -> DataFrame:
    """:func:`_compact` at the scenario's load bucket, held in executor memory: the load and
    the summary both read it instead of the attempts. The groups in ``known`` bring their
    rows from the tasks that simulated them (:mod:`retrysim.tables.key_counts`), their
    writes padded to the scenario's (a group that does not pop makes none of a pop's)."""
    groups = [group.name for group in scenario.groups]
    width = len(write_times(scenario))

    def rows_of(sums: GroupSums) -> list[tuple]:
        at = _COMPACT_WRITES
        return [
            (*row[:at], row[at] + [None] * (width - len(row[at])), *row[at + 1 :])
            for row in sums.compact
        ]

    return with_known(
        attempts, groups, lambda rows: _compact(rows, scenario), known, rows_of
    ).localCheckpoint()


def load_from_attempts(
    spark: SparkSession,
    attempts: DataFrame,
    scenario: Scenario,
    compact: DataFrame | None = None,
    changes: DataFrame | None = None,
) -> DataFrame:
    """The ``load`` table: per group and bucket, counts, gauges at the bucket's end and their
    largest values within it, the schedule backlog per delay level, thread use and the
    oldest Ready message's age. ``compact``: :func:`compact_attempts` of ``attempts``;
    ``changes``: :func:`retrysim.tables.peaks.bucket_changes`, when the caller holds them."""
    bucket_ms = scenario.load_bucket
    buckets = -(-scenario.horizon // bucket_ms)
    compact = compact if compact is not None else compact_attempts(attempts, scenario)
    changes = changes if changes is not None else bucket_changes(attempts, scenario)
    events = _events(compact).where(F.col("bucket") < buckets)
    names = (*LOAD_COUNTS, *LOAD_GAUGES)
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
    oldest = _oldest_ready(compact, buckets).select(
        "group", (F.col("start_bucket") - 1).alias("bucket"), "min_ready"
    )
    busy = "threads_busy"
    peaks = changes.where(F.col("level") == F.lit(ALL_LEVELS)).select(
        "group",
        "bucket",
        "longest_wait",
        *[f"{gauge}_{part}" for gauge in (*LOAD_GAUGES, busy) for part in ("total", "rise")],
    )
    filled = (
        grid.join(per_bucket, ["group", "bucket"], "left")
        .join(_busy_ms(compact, bucket_ms), ["group", "bucket"], "left")
        .join(oldest, ["group", "bucket"], "left")
        .join(_schedule_backlog(events, groups, buckets, changes), ["group", "bucket"], "left")
        .join(peaks, ["group", "bucket"], "left")
        .fillna(0, subset=[*names, "busy_thread_ms", f"{busy}_total"])
    )
    bucket_end = (F.col("bucket") + 1) * F.lit(bucket_ms)
    oldest_ready = F.min("min_ready").over(after)
    ends = {gauge: F.sum(gauge).over(upto) for gauge in LOAD_GAUGES}
    ends[busy] = F.sum(f"{busy}_total").over(upto)

    def maximum(gauge: str) -> Column:
        return bucket_maximum(F.col(gauge), F.col(f"{gauge}_total"), F.col(f"{gauge}_rise"))

    threads_busy_max = F.round(maximum(busy) / F.lit(float(THREAD_UNITS)), 6)
    return select_schema(
        filled.withColumns(
            {
                "bucket_start_ms": F.col("bucket") * F.lit(bucket_ms),
                "bucket_ms": F.lit(bucket_ms),
                **ends,
                "commitlog_bytes": F.col("commitlog_writes") * F.col("size_bytes"),
                "utilization": F.col("busy_thread_ms") / (F.col("pool") * F.lit(bucket_ms)),
                "oldest_ready_age_ms": F.when(
                    oldest_ready < bucket_end, bucket_end - oldest_ready
                ).otherwise(F.lit(0)),
                "schedule_backlog": F.coalesce(
                    F.col("schedule_backlog"), F.array().cast("array<bigint>")
                ),
                "schedule_backlog_max": F.coalesce(
                    F.col("schedule_backlog_max"), F.array().cast("array<bigint>")
                ),
            }
        ).withColumns(
            {
                **{f"{gauge}_max": maximum(gauge) for gauge in LOAD_GAUGES},
                "utilization_max": threads_busy_max / F.col("pool"),
                "oldest_ready_age_ms_max": F.greatest(
                    F.col("oldest_ready_age_ms"), F.coalesce(F.col("longest_wait"), F.lit(0))
                ),
            }
        ),
        data_schema(LOAD),
    )


def _schedule_backlog(
    events: DataFrame, groups: DataFrame, buckets: int, changes: DataFrame
) -> DataFrame:
    """Messages waiting in SCHEDULE_TOPIC_XXXX per delay level at each bucket's end and at
    most within it, as arrays indexed by level - 1 (4.x concurrent groups; empty for the
    others)."""
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
        .join(
            changes.where(F.col("level") > F.lit(ALL_LEVELS)).select(
                "group", "level", "bucket", "schedule_total", "schedule_rise"
            ),
            ["group", "level", "bucket"],
            "left",
        )
        .fillna(0, subset=["delta"])
        .withColumn("backlog", F.sum("delta").over(upto))
        .withColumn(
            "backlog_max",
            bucket_maximum(F.col("backlog"), F.col("schedule_total"), F.col("schedule_rise")),
        )
    )

    def by_level(column: str) -> Column:
        return F.transform(
            F.array_sort(F.collect_list(F.struct("level", column))), lambda x: x[column]
        ).alias(f"schedule_{column}")

    return levels.groupBy("group", "bucket").agg(by_level("backlog"), by_level("backlog_max"))
