"""The ``summary`` table: one row per group, from the compacted attempts and the load.

Percentiles are exact (Spark's ``percentile`` semantics), not ``percentile_approx``: the
approximate sketch depends on how rows are merged across partitions, and the same scenario
must give the same tables on any cluster.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from retrysim.model.states import (
    COMMIT,
    DISCARD,
    DLQ,
)
from retrysim.scenario.spec import Scenario
from retrysim.tables.group_sums import QUANTILES, RATE_COLUMNS, GroupSums
from retrysim.tables.groups import groups_df, literal_map
from retrysim.tables.instances import instance_extremes, instance_load_from
from retrysim.tables.load import compact_attempts
from retrysim.tables.peaks import bucket_changes, run_maxima, with_known
from retrysim.tables.schemas import (
    SUMMARY,
    data_schema,
    select_schema,
)

# The summary's own percentile columns, picked from QUANTILES.
PERCENTILES = (0.5, 0.95, 0.99)


def exact_percentiles(values: DataFrame, shares: tuple[float, ...]) -> DataFrame:
    """Spark's exact ``percentile`` of ``value`` per (group, kind), from a histogram.

    ``percentile`` gathers every distinct value of a group in one task's hash map, which at
    a hundred million messages with spread-out times is more than a task's memory. Counting
    each distinct value first is a distributed aggregation; the ranks then come from a running
    sum over the (far fewer) distinct values, and the result is the same number: the value at
    rank ``(n - 1) p``, interpolated linearly between the two closest ranks, in the order of
    operations ``percentile`` uses, so it is bit for bit what ``percentile`` returns.
    """
    keys = ["group", "kind"]
    histogram = values.where(F.col("value").isNotNull()).groupBy(*keys, "value").count()
    upto = (
        Window.partitionBy(*keys)
        .orderBy("value")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    ranked = histogram.withColumns(
        {
            "last_rank": F.sum("count").over(upto) - 1,
            "total": F.sum("count").over(Window.partitionBy(*keys)),
        }
    )
    positions = [(F.col("total") - 1).cast("double") * F.lit(share) for share in shares]
    picks = []
    for index, position in enumerate(positions):
        for side, rank in (("lo", F.floor(position)), ("hi", F.ceil(position))):
            picks.append(
                F.min(F.when(F.col("last_rank") >= rank, F.col("value"))).alias(f"{side}{index}")
            )
    picked = ranked.groupBy(*keys).agg(F.first("total").alias("total"), *picks)
    results = []
    for index, position in enumerate(positions):
        lo, hi = F.floor(position), F.ceil(position)
        low, high = F.col(f"lo{index}").cast("double"), F.col(f"hi{index}").cast("double")
        results.append(
            F.when((lo == hi) | (low == high), low).otherwise(
                (hi - position) * low + (position - lo) * high
            )
        )
    return picked.select(*keys, F.array(*results).alias("percentiles"))


def summary_from(
    spark: SparkSession,
    attempts: DataFrame,
    load: DataFrame,
    scenario: Scenario,
    engines: dict[str, str],
    compact: DataFrame | None = None,
    times: DataFrame | None = None,
    changes: DataFrame | None = None,
    instance_load: DataFrame | None = None,
) -> DataFrame:
    """The ``summary`` table: one row per group, from staged attempts and the load table.
    The counts come from ``compact`` (:func:`compact_attempts`, a few rows per bucket and
    kind of delivery), the peaks from the load's within-bucket maxima and ``changes``
    (:func:`retrysim.tables.peaks.bucket_changes`), so only the times to commit and to DLQ
    read the attempts again (``times``: :func:`times_to_settle`), each argument computed
    here when the caller does not hold it; the busiest and idle instances come from
    ``instance_load`` (:func:`retrysim.tables.instances.instance_load_from`)."""
    if instance_load is None:
        instance_load = instance_load_from(spark, attempts, scenario, load)
    compact = compact if compact is not None else compact_attempts(attempts, scenario)
    times = times if times is not None else times_to_settle(attempts, scenario)
    changes = changes if changes is not None else bucket_changes(attempts, scenario)

    def total(kind: Column) -> Column:
        return F.coalesce(F.sum(F.when(kind, F.col("n"))), F.lit(0)).cast("long")

    ended_in = F.col("state")  # the compact rows' result_state
    copy = F.col("copy_state")  # and their second copy's (docs/model.md §6)
    per_group = compact.groupBy("group").agg(
        total(F.col("started")).alias("deliveries"),
        total(F.col("retry")).alias("retries"),
        total(ended_in == F.lit(COMMIT)).alias("commits"),
        (
            total(ended_in == F.lit(DLQ)) + total(copy == F.lit(DLQ)) - total(F.col("replayed"))
        ).alias("dlq"),
        (total(ended_in == F.lit(DISCARD)) + total(copy == F.lit(DISCARD))).alias("discards"),
        total(F.col("replayed")).alias("replayed"),
        total(copy.isNotNull()).alias("late_send_backs"),
    )
    per_group = per_group.join(times, on="group", how="left")
    from_load = load.groupBy("group").agg(
        F.sum("commitlog_writes").alias("commitlog_writes"),
        F.max("ready_backlog_max").alias("max_ready_backlog"),
        F.max("waiting_retry_max").alias("max_waiting_retry"),
        F.max("inflight_max").alias("max_inflight"),
        F.max("utilization_max").alias("peak_utilization"),
        F.max("oldest_ready_age_ms_max").alias("max_oldest_ready_age_ms"),
    )
    maxima = run_maxima(changes).select(
        "group",
        F.col("schedule").alias("max_schedule_backlog"),
        *[F.col(rate).alias(f"peak_{rate}_per_s") for rate in RATE_COLUMNS],
    )
    counted = ("deliveries", "retries", "commits", "dlq", "discards", "replayed", "late_send_backs")
    peaks = (
        "max_ready_backlog",
        "max_waiting_retry",
        "max_inflight",
        "max_oldest_ready_age_ms",
        "max_schedule_backlog",
        *[f"peak_{rate}_per_s" for rate in RATE_COLUMNS],
    )
    joined = (
        groups_df(spark, scenario)
        .join(per_group, on="group", how="left")
        .join(from_load, on="group", how="left")
        .join(maxima, on="group", how="left")
        .join(instance_extremes(instance_load, scenario), on="group", how="left")
        .fillna(0, subset=[*counted, "commitlog_writes", *peaks])
    )
    columns = {
        "pending": F.col("messages")
        + F.col("late_send_backs")
        - F.col("commits")
        - F.col("dlq")
        - F.col("discards"),
        "amplification": F.col("deliveries") / F.col("messages"),
        "write_amplification": F.col("commitlog_writes") / F.col("messages"),
        "engine": literal_map(engines)[F.col("group")],
    }
    for share in PERCENTILES:
        label, index = f"p{round(share * 100)}", QUANTILES.index(share)
        columns[f"{label}_time_to_commit_ms"] = F.col("ttc")[index]
        columns[f"{label}_time_to_dlq_ms"] = F.col("ttd")[index]
    columns["time_to_commit_quantiles_ms"] = F.col("ttc")
    columns["time_to_dlq_quantiles_ms"] = F.col("ttd")
    return select_schema(joined.withColumns(columns), data_schema(SUMMARY))


def times_to_settle(
    attempts: DataFrame, scenario: Scenario, known: dict[str, GroupSums] | None = None
) -> DataFrame:
    """Per group, the exact quantiles (QUANTILES) of the time from publishing to commit
    (``ttc``) and to the DLQ (``ttd``), as arrays. Held in executor memory: a few rows, from
    a scan of every attempt that needs nothing else, so it can run beside the other scans;
    the groups in ``known`` bring theirs from the tasks that simulated them."""
    state = F.col("result_state")

    def times_of(rows: DataFrame) -> DataFrame:
        settled = rows.where(state.isin(COMMIT, DLQ)).select(
            "group", state.alias("kind"), (F.col("settled_ms") - F.col("born_ms")).alias("value")
        )
        copies = rows.where(F.col("copy_state") == F.lit(DLQ)).select(  # a second copy's
            "group", F.lit(DLQ).alias("kind"), (F.col("copy_ms") - F.col("born_ms")).alias("value")
        )
        return (
            exact_percentiles(settled.unionByName(copies), QUANTILES)
            .groupBy("group")
            .pivot("kind", [COMMIT, DLQ])
            .agg(F.first("percentiles"))
            .withColumnsRenamed({COMMIT: "ttc", DLQ: "ttd"})
        )

    def rows_of(sums: GroupSums) -> list[tuple]:
        return [] if sums.ttc is None and sums.ttd is None else [(sums.group, sums.ttc, sums.ttd)]

    groups = [group.name for group in scenario.groups]
    return with_known(attempts, groups, times_of, known, rows_of).localCheckpoint()
