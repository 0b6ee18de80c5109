"""Message generation on Spark: ids, queues and publish times, with nothing built on the driver.

``uniform`` arrivals are evenly spaced over ``over``. ``poisson`` arrivals are a Poisson
process conditioned on its count: given N arrivals in a window, their times are N independent
uniform points, so each message draws its own time from a hash and no sort is needed.
Queues are assigned round-robin, as RocketMQ's default producer queue selector does.
"""

from __future__ import annotations

import math

import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from retrysim.model.rng import uniform, uniform_np
from retrysim.scenario.spec import Group, Workload
from retrysim.tables.schemas import MESSAGES, data_schema, select_schema

# The first round's files are the attempts table's files (engine/rounds.py), one per
# partition. Fewer, bigger tasks write faster and make fewer files; the cap bounds what a
# failed task has to redo on a cluster.
ROWS_PER_PARTITION = 64_000_000
_ARRIVAL_STREAM = "arrival"


def partitions_for(spark: SparkSession, rows: int) -> int:
    """Enough partitions to use every core, and to keep each one a few million rows at most;
    a multiple of the cores, so that the last wave of tasks does not leave cores idle."""
    cores = spark.sparkContext.defaultParallelism
    return cores * max(1, math.ceil(rows / ROWS_PER_PARTITION / cores))


def messages_df(spark: SparkSession, group: Group, seed: int) -> DataFrame:
    """One row per message of ``group``, in the ``messages`` table's shape (no run_id)."""
    workload = group.workload
    msg_id = F.col("id")
    if workload.arrival == "uniform":
        born = F.floor(msg_id * F.lit(workload.over) / F.lit(workload.messages))
    else:
        born = F.floor(uniform(seed, group.name, _ARRIVAL_STREAM, msg_id) * workload.over)
    return select_schema(
        spark.range(0, workload.messages, numPartitions=partitions_for(spark, workload.messages))
        .withColumn("group", F.lit(group.name))
        .withColumn("topic", F.lit(group.source_topic))
        .withColumn("msg_id", msg_id)
        .withColumn("queue_id", (msg_id % F.lit(workload.queues)).cast("int"))
        .withColumn("born_ms", born.cast("long"))
        .withColumn("size_bytes", F.lit(workload.size_bytes)),
        data_schema(MESSAGES),
    )


def messages_np(
    workload: Workload,
    group: str,
    seed: int,
    lane: int | None = None,
    msg_ids: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`messages_df`'s ``msg_id``, ``queue_id`` and ``born_ms`` in NumPy, bit for bit
    (the same double arithmetic), for the whole group, one of its queues (``lane``) or the
    ids ``msg_ids``: a task that simulates them event by event makes them itself, and no
    message crosses the network."""
    if msg_ids is not None:
        msg_ids = np.asarray(msg_ids, dtype=np.int64)
    elif lane is None:
        msg_ids = np.arange(workload.messages, dtype=np.int64)
    else:
        msg_ids = np.arange(lane, workload.messages, workload.queues, dtype=np.int64)
    if workload.arrival == "uniform":
        born = np.floor((msg_ids * workload.over).astype(np.float64) / float(workload.messages))
    else:
        born = np.floor(uniform_np(seed, group, _ARRIVAL_STREAM, msg_ids) * workload.over)
    return msg_ids, msg_ids % workload.queues, born.astype(np.int64)
