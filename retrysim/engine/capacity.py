"""Finite consumer capacity: when is the round engine's answer exact, and how busy is the pool?

Every consumer instance of a group has its own ``threads``, served first come, first served
(docs/model.md §5); which instance runs a delivery does not depend on timing
(:mod:`retrysim.model.topology`). A round run assumes every delivery starts when it is
eligible. For unordered consumption that assumption is exactly right as long as no
instance's pool is ever full: if at no moment more than ``C`` consume requests run at once on
an instance in the unlimited run, then its ``C`` threads find a free one for every delivery
at its eligible time (each delivery sees the same busy count in both), and the two runs are
the same, row for row. So the runner simulates with rounds first and checks the peak
concurrency of every instance here; a group where one exceeds its threads is re-simulated
event by event (:mod:`retrysim.engine.event_stage`), which models the waiting exactly. There
is no approximation error either way; the check only decides which engine is exact for the
group.

Where the scenario alone says a pool fills up (:func:`offered_load`: the first deliveries
alone would keep the busiest instance's threads busy :data:`CERTAINLY_FULL` times over), the
group skips the round run. Choosing the sequential engine is never wrong, only slower when
the pool would not have filled: both engines are exact there and give the same rows.

The check is cheap first: per time bucket, the threads busy at the bucket's start plus the
requests starting in it bound the bucket's peak. Only buckets whose bound exceeds the pool
are examined event by event (a window per bucket, parallel across buckets).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from retrysim.model.topology import BY_MESSAGE, BY_QUEUE, Topology
from retrysim.model.workload import peak_rate_per_ms
from retrysim.scenario.spec import Group

CHECK_BUCKET_MS = 1_000
# Offered this many times its threads while messages arrive, an instance's pool fills up:
# the group is simulated event by event at once, without a round run to throw away.
CERTAINLY_FULL = 1.5
# Order of events at one millisecond (model §5): threads freed first, then starts, then the
# end of a zero-length request, which held its thread for that instant.
_END, _START, _ZERO_END = 0, 1, 2


def _busy_end(attempts: DataFrame) -> Column:
    return F.col("start_ms") + F.col("processing_ms")


def peak_concurrency(attempts: DataFrame, pools: dict[str, int]) -> dict[str, int]:
    """The largest number of consume requests running at once on one instance, per group in
    ``pools`` (its threads per instance), where that number exceeds them (groups within their
    pools are omitted)."""
    started = attempts.where(F.col("group").isin(*pools) & F.col("start_ms").isNotNull()).select(
        F.col("group"),
        F.col("consumer_instance").alias("instance"),
        "msg_id",
        "delivery",
        "start_ms",
        _busy_end(attempts).alias("busy_end"),
    )
    bucket = F.lit(CHECK_BUCKET_MS)
    events = started.select(
        "group",
        "instance",
        "msg_id",
        "delivery",
        F.explode(
            F.array(
                F.struct(
                    F.col("start_ms").alias("at_ms"),
                    F.lit(_START).alias("kind"),
                    F.lit(1).alias("delta"),
                ),
                F.struct(
                    F.col("busy_end").alias("at_ms"),
                    F.when(F.col("busy_end") == F.col("start_ms"), F.lit(_ZERO_END))
                    .otherwise(F.lit(_END))
                    .alias("kind"),
                    F.lit(-1).alias("delta"),
                ),
            )
        ).alias("event"),
    ).select("group", "instance", "msg_id", "delivery", "event.*")
    events = events.withColumn("bucket", F.floor(F.col("at_ms") / bucket))
    per_bucket = events.groupBy("group", "instance", "bucket").agg(
        F.sum("delta").alias("delta"),
        F.sum(F.when(F.col("kind") == F.lit(_START), 1).otherwise(0)).alias("starts"),
    )
    before = (
        Window.partitionBy("group", "instance")
        .orderBy("bucket")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    levels = per_bucket.withColumn("level", F.coalesce(F.sum("delta").over(before), F.lit(0)))
    pool = F.create_map(*[x for name, size in pools.items() for x in (F.lit(name), F.lit(size))])
    suspect = levels.where(F.col("level") + F.col("starts") > pool[F.col("group")])
    if suspect.isEmpty():
        return {}
    in_order = (
        Window.partitionBy("group", "instance", "bucket")
        .orderBy("at_ms", "kind", "msg_id", "delivery")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    exact = (
        events.join(
            suspect.select("group", "instance", "bucket", "level"),
            ["group", "instance", "bucket"],
            "inner",
        )
        .withColumn("running", F.col("level") + F.sum("delta").over(in_order))
        .where(F.col("kind") == F.lit(_START))
        .groupBy("group")
        .agg(F.max("running").alias("peak"))
        .where(F.col("peak") > pool[F.col("group")])
    )
    return {row["group"]: row["peak"] for row in exact.collect()}


def offered_load(group: Group, topology: Topology) -> float | None:
    """The thread time the busiest instance is offered by first deliveries alone while the
    messages arrive (at the busiest piece's rate of a traffic shape), over its threads: a
    lower bound of its mean concurrency then, in threads (retries only add to it; the
    shortest processing mean counts, outages' too).
    None for an unlimited pool or messages published all at once."""
    workload, behavior = group.workload, group.behavior
    if topology.threads is None or workload.over <= 0:
        return None
    if topology.balancing == BY_QUEUE:
        share = topology.most_lanes_per_instance / topology.queues
    elif topology.balancing == BY_MESSAGE:
        share = 1 / topology.instances
    else:
        share = 1.0  # broadcasting: every instance consumes every message
    means = [behavior.processing_time.mean]
    means += [o.processing_time.mean for o in behavior.windows if o.processing_time is not None]
    thread_ms = min(means) + behavior.client_overhead  # the client's own time holds it too
    return share * peak_rate_per_ms(workload) * thread_ms / topology.threads
