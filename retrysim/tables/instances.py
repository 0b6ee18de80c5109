"""The ``instance_load`` table: each consumer instance's work per load bucket.

A group's instances do not share threads (docs/model.md §5), so a group that looks half idle
in ``load`` can have one instance saturated: the 4.x instance that holds the only retry
queue in a retry storm, or the instances a rebalance gave more queues. This table shows each
instance that can get work (by queue: those that own a queue), per bucket: deliveries
started, its Ready backlog (deliveries waiting for its threads) at the bucket's end and at
most within it, and its threads' use, exact from the same moments as the group's peaks
(:func:`retrysim.tables.peaks.instance_changes`).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from retrysim.model.policy import policy_for
from retrysim.model.topology import BROADCAST
from retrysim.scenario.spec import Scenario
from retrysim.tables.group_sums import THREAD_UNITS, GroupSums
from retrysim.tables.groups import groups_df, literal_map
from retrysim.tables.peaks import EXACT, bucket_maximum, instance_changes
from retrysim.tables.schemas import INSTANCE_LOAD, data_schema, select_schema

_KEYS = ["group", "consumer_instance", "bucket"]


def shared_groups(scenario: Scenario) -> list[str]:
    """The groups whose work more than one instance can get: the others' one instance does
    the group's load, row for row."""
    table = scenario.broker.message_delay_level
    return [g.name for g in scenario.groups if policy_for(g, table).topology.shared]


def changes_of_shared_groups(
    attempts: DataFrame, scenario: Scenario, known: dict[str, GroupSums] | None = None
) -> DataFrame | None:
    """:func:`instance_changes` of the :func:`shared_groups` (None when there are none): a
    single instance's rows are the load's, so its attempts are not exploded again. The
    groups in ``known`` bring theirs from the tasks that simulated them."""
    shared = shared_groups(scenario)
    if not shared:
        return None
    return instance_changes(attempts.where(F.col("group").isin(*shared)), scenario, known, shared)


def instance_load_from(
    spark: SparkSession,
    attempts: DataFrame,
    scenario: Scenario,
    load: DataFrame,
    changes: DataFrame | None = None,
) -> DataFrame:
    """The ``instance_load`` table from staged attempts and the run's ``load`` (its rows
    are a single instance's); ``changes``: :func:`changes_of_shared_groups`, when the caller
    holds them."""
    shared = shared_groups(scenario)
    alone = _from_load(load.where(~F.col("group").isin(*(shared or [""]))))
    if not shared:
        return alone
    if changes is None:
        changes = changes_of_shared_groups(attempts, scenario)
    return alone.unionByName(_from_changes(spark, scenario, shared, changes))


def _from_load(load: DataFrame) -> DataFrame:
    return select_schema(load.withColumn("consumer_instance", F.lit(0)), data_schema(INSTANCE_LOAD))


def _from_changes(
    spark: SparkSession, scenario: Scenario, shared: list[str], changes: DataFrame
) -> DataFrame:
    bucket_ms = scenario.load_bucket
    buckets = -(-scenario.horizon // bucket_ms)
    grid = (
        groups_df(spark, scenario)
        .where(F.col("group").isin(*shared))
        .select(
            "group",
            "threads",
            F.explode(F.sequence(F.lit(0), F.col("assignable_instances") - 1)).alias(
                "consumer_instance"
            ),
        )
        .crossJoin(spark.range(0, buckets, numPartitions=1).withColumnRenamed("id", "bucket"))
    )
    filled = grid.join(changes, _KEYS, "left").fillna(
        0, subset=["deliveries", "ready_backlog_total", "threads_busy_total", "threads_busy_area"]
    )
    upto = (
        Window.partitionBy("group", "consumer_instance")
        .orderBy("bucket")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    units = F.lit(float(THREAD_UNITS))

    def maximum(gauge: str) -> Column:
        return bucket_maximum(F.col(gauge), F.col(f"{gauge}_total"), F.col(f"{gauge}_rise"))

    ends = filled.withColumns(
        {
            "ready_backlog": F.sum("ready_backlog_total").over(upto),
            "threads_busy": F.sum("threads_busy_total").over(upto),
        }
    )
    entered = (F.col("threads_busy") - F.col("threads_busy_total")).cast(EXACT)
    area = entered * F.lit(bucket_ms).cast(EXACT) + F.col("threads_busy_area")
    busy_ms = (area / units.cast(EXACT)).cast("double")
    threads = F.col("threads") * F.lit(bucket_ms)
    return select_schema(
        ends.withColumns(
            {
                "bucket_start_ms": F.col("bucket") * F.lit(bucket_ms),
                "bucket_ms": F.lit(bucket_ms),
                "ready_backlog_max": maximum("ready_backlog"),
                "busy_thread_ms": F.round(busy_ms, 6),
                "utilization": F.round(busy_ms, 6) / threads,
                "utilization_max": F.round(maximum("threads_busy") / units, 6) / F.col("threads"),
            }
        ),
        data_schema(INSTANCE_LOAD),
    )


def instance_extremes(instance_load: DataFrame, scenario: Scenario) -> DataFrame:
    """Per group: the busiest instance (the most thread time in one bucket; the lowest
    instance of a tie), its utilization in that bucket, and how many instances ran no
    delivery in the whole run (those rebalance gave no queue included)."""
    busiest = Window.partitionBy("group").orderBy(
        F.col("busy_thread_ms").desc(), "consumer_instance", "bucket_start_ms"
    )
    top = (
        instance_load.withColumn("rank", F.row_number().over(busiest))
        .where(F.col("rank") == 1)
        .select(
            "group",
            F.col("consumer_instance").alias("busiest_instance"),
            F.col("utilization").alias("busiest_instance_utilization"),
        )
    )
    working = (
        instance_load.groupBy("group", "consumer_instance")
        .agg(F.sum("deliveries").alias("deliveries"))
        .groupBy("group")
        .agg(F.sum(F.when(F.col("deliveries") > 0, 1).otherwise(0)).alias("working"))
    )
    table = scenario.broker.message_delay_level
    topologies = {g.name: policy_for(g, table).topology for g in scenario.groups}
    instances = {name: topology.instances for name, topology in topologies.items()}
    broadcast = {name for name, topology in topologies.items() if topology.balancing == BROADCAST}
    count = literal_map(instances)
    # broadcasting: every instance does what instance 0 does
    working_all = F.when(
        F.col("group").isin(*sorted(broadcast or {""})) & (F.col("working") > 0),
        count[F.col("group")],
    ).otherwise(F.col("working"))
    return top.join(working, "group", "left").select(
        "group",
        "busiest_instance",
        "busiest_instance_utilization",
        (count[F.col("group")] - F.coalesce(working_all, F.lit(0))).alias("idle_instances"),
    )
