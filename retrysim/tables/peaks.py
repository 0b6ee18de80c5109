"""Exact peaks: each gauge's largest value within a load bucket, from events, not samples.

A gauge (messages Ready, Inflight, WaitingRetry, in the schedule topic, threads busy) only
changes at the moments of a delivery's events. All events of one millisecond happen
together, so a gauge is a step function whose value on ``[m, next event)`` is the sum of
every change at or before ``m``. Its largest value within a bucket is the value it enters
the bucket with (unless a change lands on the bucket's first millisecond) or one of its
values after a change inside the bucket.

Each attempt becomes a few moments (Ready, start, end, the end of its WaitingRetry, ...),
each carrying its change to every gauge and its counts; they are summed per (group,
millisecond), and a running sum per (group, bucket) gives every gauge's rise within the
bucket in one window: the work splits by bucket, and the value a bucket enters with is a
running sum over the few bucket rows (:func:`bucket_maximum`). The per-millisecond sums
also give the deliveries, retries and commit-log writes of every second (the peak rates),
and the longest wait of a delivery that left Ready in each bucket.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from retrysim.model.states import (
    READY_PUBLISHED,
    READY_REPLAYED,
    WAITING_RETRY,
)
from retrysim.scenario import limits
from retrysim.scenario.spec import Scenario
from retrysim.tables.commitlog_writes import write_times
from retrysim.tables.group_sums import ALL_LEVELS, GAUGES, RATE_COLUMNS, THREAD_UNITS, GroupSums
from retrysim.tables.schemas import local_rows

# Thread time in THREAD_UNITS: a thousand threads x a bucket outgrows a long.
EXACT = "decimal(38,0)"
_FIELDS = (*GAUGES, *RATE_COLUMNS)


def _change(at: Column, level: Column | None = None, **changes: Column) -> Column:
    """A moment's time, level and change to each field (0 unless given)."""
    zero = F.lit(0).cast("long")
    return F.struct(
        at.cast("long").alias("t"),
        (level if level is not None else F.lit(ALL_LEVELS)).cast("int").alias("level"),
        *[changes.get(name, zero).cast("long").alias(name) for name in _FIELDS],
        changes.get("ready_wait", F.lit(None)).cast("long").alias("ready_wait"),
    )


def _moment(when: Column, at: Column, level: Column | None = None, **changes: Column) -> Column:
    """One moment of an attempt, if it has it."""
    return F.when(when & at.isNotNull(), _change(at, level, **changes))


def _moments(scenario: Scenario, writes: bool) -> Column:
    """The moments of an attempt, and with ``writes`` one per commit-log write
    (retrysim.tables.commitlog_writes). A delivery started when it became Ready changes the Ready
    backlog by nothing, so its Ready moment is left out; a moment that coincides with
    another (the thread freed at the end) joins it."""
    c = F.col
    one = F.lit(1)

    def flag(condition: Column) -> Column:
        return F.when(condition, one).otherwise(F.lit(0))

    started = c("start_ms").isNotNull()
    waited = ~started | (c("start_ms") > c("ready_ms"))
    waits_retry = c("end_state") == F.lit(WAITING_RETRY)
    scheduled = waits_retry & (c("end_topic") == F.lit(limits.SCHEDULE_TOPIC))
    busy = started & (c("processing_ms") > 0)
    share = F.floor(F.lit(THREAD_UNITS) / c("batch_size"))
    freed = c("start_ms") + c("processing_ms")
    # a request running at the horizon has no end: its thread is freed on its own moment
    frees_at_end = busy & F.coalesce(freed == c("end_ms"), F.lit(False))
    # a retry leaves the schedule topic when it is due; a 4.9.7 fallback's dead letter when
    # it reaches the DLQ
    waited_until = F.coalesce(c("next_ready_ms"), c("settled_ms"))
    copied = c("copy_state") == F.lit(WAITING_RETRY)
    moments = [
        _moment(waited, c("ready_ms"), ready_backlog=one),
        _moment(
            started,
            c("start_ms"),
            ready_backlog=-flag(waited),
            inflight=one,
            threads_busy=F.when(busy, share).otherwise(F.lit(0)),
            deliveries=one,
            retries=flag(~c("ready_reason").isin(READY_PUBLISHED, READY_REPLAYED)),
        ),
        _moment(started & waited, c("start_ms") - one, ready_wait=c("start_ms") - c("ready_ms")),
        _moment(
            c("end_ms").isNotNull(),
            c("end_ms"),
            inflight=-one,
            waiting_retry=flag(waits_retry),
            schedule=flag(scheduled),
            threads_busy=F.when(frees_at_end, -share).otherwise(F.lit(0)),
        ),
        _moment(busy & ~frees_at_end, freed, threads_busy=-share),
        _moment(waits_retry, waited_until, waiting_retry=-one, schedule=-flag(scheduled)),
        _moment(scheduled, c("end_ms"), c("delay_level"), schedule=one),
        _moment(scheduled, waited_until, c("delay_level"), schedule=-one),
        # a 4.9 client's second copy, WaitingRetry in the schedule topic until it is due
        _moment(copied, c("copy_ms"), waiting_retry=one, schedule=one),
        _moment(copied, c("copy_ready_ms"), waiting_retry=-one, schedule=-one),
        _moment(copied, c("copy_ms"), c("copy_delay_level"), schedule=one),
        _moment(copied, c("copy_ready_ms"), c("copy_delay_level"), schedule=-one),
    ]
    if not writes:
        return F.array(*moments)
    return F.array(
        *moments, *[_moment(F.lit(True), t, commitlog_writes=one) for t in write_times(scenario)]
    )


def _rise(highest: str, first_t: str, bucket_ms: int) -> Column:
    """A gauge's largest value in the bucket minus the value it entered with: the entering
    value counts unless the bucket's first change is on its first millisecond."""
    entered = F.col(first_t) > F.col("bucket") * F.lit(bucket_ms)
    return F.when(entered, F.greatest(F.col(highest), F.lit(0))).otherwise(F.col(highest))


def _exploded(
    attempts: DataFrame,
    scenario: Scenario,
    fields: tuple[str, ...],
    by: tuple[str, ...] = ("group",),
    until: int | None = None,
) -> DataFrame:
    """The attempts' moments before the horizon (or ``until``) that change one of
    ``fields``, one row each, with the attempt's ``by`` columns."""
    changes = [F.col(f"m.{name}") != F.lit(0) for name in fields if name != "ready_wait"]
    if "ready_wait" in fields:
        changes.append(F.col("m.ready_wait").isNotNull())
    any_change = changes[0]
    for change in changes[1:]:
        any_change = any_change | change
    return (
        attempts.select(*by, F.explode(_moments(scenario, "commitlog_writes" in fields)).alias("m"))
        .where(
            F.col("m").isNotNull()
            & (F.col("m.t") < F.lit(until if until is not None else scenario.horizon))
            & any_change
        )
        .select(*by, "m.t", "m.level", *[f"m.{name}" for name in fields])
    )


def _gauge_changes(
    moments: DataFrame, keys: list[str], gauges: tuple[str, ...], bucket_ms: int, *more: Column
) -> DataFrame:
    """Per ``keys`` (a bucket among them): each gauge's net change (``<gauge>_total``) and
    rise (``<gauge>_rise``), and the ``more`` aggregates. The moments are sorted per key by
    time, and a running sum over a range frame counts every change of a millisecond at once
    (the frame takes the row's peers), so no per-millisecond aggregate is shuffled first."""
    upto = (
        Window.partitionBy(*keys)
        .orderBy("t")
        .rangeBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return (
        moments.withColumns({f"{g}_after": F.sum(g).over(upto) for g in gauges})
        .groupBy(*keys)
        .agg(
            *[F.sum(g).alias(f"{g}_total") for g in gauges],
            *[F.max(f"{g}_after").alias(f"{g}_highest") for g in gauges],
            F.min("t").alias("first_t"),
            *more,
        )
        .withColumns({f"{g}_rise": _rise(f"{g}_highest", "first_t", bucket_ms) for g in gauges})
        .drop("first_t", *[f"{g}_highest" for g in gauges])
    )


def bucket_changes(
    attempts: DataFrame, scenario: Scenario, known: dict[str, GroupSums] | None = None
) -> DataFrame:
    """Per (group, level, bucket) with any change before the horizon. Level 0 rows: each
    gauge's net change (``<gauge>_total``) and rise (``<gauge>_rise``, its largest value in
    the bucket minus the value it entered with), each rate's busiest second starting in the
    bucket (``<rate>_busiest``) and the longest wait of a delivery that left Ready in it
    (``longest_wait``); a bucket with rates and no gauge change has zero totals and null
    rises and wait. Level L rows: ``schedule_total`` and ``schedule_rise`` of delay level
    L. Held in executor memory: a few rows per bucket. The rows of the groups in ``known``
    come from the tasks that simulated them (:mod:`retrysim.tables.key_peaks`)."""
    bucket_ms = scenario.load_bucket
    # bucket first: the sort's prefix then tells rows apart (a group name rarely does)
    keys = ["bucket", "level", "group"]

    def gauges_of(rows: DataFrame) -> DataFrame:
        moments = _exploded(rows, scenario, (*GAUGES, "ready_wait")).withColumn(
            "bucket", _bucket(bucket_ms)
        )
        return _gauge_changes(
            moments, keys, GAUGES, bucket_ms, F.max("ready_wait").alias("longest_wait")
        )

    def rates_of(rows: DataFrame) -> DataFrame:
        second = F.floor(F.col("t") / F.lit(1000))
        return (
            _exploded(rows, scenario, RATE_COLUMNS)
            .groupBy("group", "level", second.alias("second"))
            .agg(*[F.sum(r).alias(r) for r in RATE_COLUMNS])
            .groupBy(
                F.floor(F.col("second") * F.lit(1000) / F.lit(bucket_ms)).alias("bucket"),
                "level",
                "group",
            )
            .agg(*[F.max(r).alias(f"{r}_busiest") for r in RATE_COLUMNS])
        )

    def changes_of(rows: DataFrame) -> DataFrame:
        # a bucket where only commit-log writes happen (a 5.x pop's checkpoint and ack put by
        # the timer wheel a minute on) changes no gauge, and its busiest second still counts
        return (
            gauges_of(rows)
            .join(rates_of(rows), keys, "full")
            .fillna(0, subset=[f"{g}_total" for g in GAUGES])
        )

    groups = [group.name for group in scenario.groups]
    return with_known(
        attempts, groups, changes_of, known, lambda sums: sums.changes
    ).localCheckpoint()


def _bucket(bucket_ms: int) -> Column:
    return F.floor(F.col("t") / F.lit(bucket_ms))


def instance_changes(
    attempts: DataFrame,
    scenario: Scenario,
    known: dict[str, GroupSums] | None = None,
    groups: list[str] | None = None,
) -> DataFrame:
    """Per (bucket, group, consumer_instance) with a change: the Ready backlog's and the
    threads busy's net change and rise (as :func:`bucket_changes`), the deliveries started,
    and ``threads_busy_area``, the sum of each threads-busy change times the time from it to
    the bucket's end: with the value the bucket entered with, the exact busy thread time in
    it (THREAD_UNITS per thread-millisecond), as the load counts it: a thread busy past the
    horizon is freed when its request ends, up to the last bucket's end. Held in executor
    memory."""
    bucket_ms = scenario.load_bucket
    keys = ["bucket", "consumer_instance", "group"]
    fields = ("ready_backlog", "threads_busy", "deliveries")
    last_end = -(-scenario.horizon // bucket_ms) * bucket_ms
    bucket_end = (F.col("bucket") + F.lit(1)) * F.lit(bucket_ms)

    def changes_of(rows: DataFrame) -> DataFrame:
        moments = _exploded(
            rows, scenario, fields, ("group", "consumer_instance"), until=last_end
        ).withColumn("bucket", _bucket(bucket_ms))
        return _gauge_changes(
            moments,
            keys,
            fields[:2],
            bucket_ms,
            F.sum("deliveries").alias("deliveries"),
            # exact: up to a thousand threads x a bucket x THREAD_UNITS outgrows a long
            F.sum(F.col("threads_busy").cast(EXACT) * (bucket_end - F.col("t")).cast(EXACT)).alias(
                "threads_busy_area"
            ),
        )

    groups = groups if groups is not None else [group.name for group in scenario.groups]
    return with_known(
        attempts, groups, changes_of, known, lambda sums: sums.instances
    ).localCheckpoint()


def with_known(
    attempts: DataFrame,
    groups: list[str],
    compute: Callable[[DataFrame], DataFrame],
    known: dict[str, GroupSums] | None,
    rows_of: Callable[[GroupSums], list[tuple] | None],
) -> DataFrame:
    """``compute`` over the ``attempts`` (of ``groups``) but those of the groups ``known``
    holds, with the rows ``rows_of`` gives for those (in ``compute``'s schema): the attempts
    of groups summed up where they were simulated are not read again, and without any the
    attempts are computed as they are."""
    held = {name: rows_of(sums) for name, sums in (known or {}).items() if name in groups}
    held = {name: rows for name, rows in held.items() if rows is not None}
    if not held:
        return compute(attempts)
    computed = compute(attempts.where(~F.col("group").isin(*sorted(held))))
    rows = [row for name in sorted(held) for row in held[name]]
    given = local_rows(attempts.sparkSession, rows, computed.schema)
    return given.unionByName(computed) if set(groups) - set(held) else given


def bucket_maximum(end: Column, total: Column, rise: Column) -> Column:
    """A gauge's largest value in a bucket from its value at the bucket's end, the bucket's
    net change and its rise: the value it entered with is ``end - total``."""
    return F.when(rise.isNull(), end).otherwise(end - total + rise)


def run_maxima(changes: DataFrame) -> DataFrame:
    """Per group, the run's exact peaks: each gauge's largest value (the schedule topic all
    levels together; threads busy in THREAD_UNITS), the busiest second of each rate, and the
    longest wait in Ready. A bucket without changes keeps the value it entered with, which
    the bucket before it reached, so the buckets with changes are enough."""
    upto = (
        Window.partitionBy("group")
        .orderBy("bucket")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    rows = changes.where(F.col("level") == F.lit(ALL_LEVELS))
    peaks = {
        g: bucket_maximum(F.sum(f"{g}_total").over(upto), F.col(f"{g}_total"), F.col(f"{g}_rise"))
        for g in GAUGES
    }
    return (
        rows.withColumns(peaks)
        .groupBy("group")
        .agg(
            *[F.max(g).alias(g) for g in GAUGES],
            *[F.max(f"{r}_busiest").alias(r) for r in RATE_COLUMNS],
            F.max("longest_wait").alias("ready_wait"),
        )
    )
