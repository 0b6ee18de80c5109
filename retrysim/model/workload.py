"""Message generation on Spark: ids, queues and publish times, with nothing built on the driver.

``uniform`` arrivals are evenly spaced over ``over``. ``poisson`` arrivals are a Poisson
process conditioned on its count: given N arrivals in a window, their times are N independent
uniform points, so each message draws its own time from a hash and no sort is needed. A
traffic shape (``arrival: profile`` or ``file``) is a list of pieces, each with its count of
consecutive ids spread the same way (``within``) over the piece: message ``first + k`` of a
piece of ``n`` starting at ``s`` and lasting ``L`` is born at ``s + floor(k * L / n)``.
Queues are assigned round-robin, as RocketMQ's default producer queue selector does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import reduce

import numpy as np
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from retrysim.model.rng import uniform, uniform_np
from retrysim.scenario.spec import Group, Piece, Scenario, Workload
from retrysim.tables.schemas import MESSAGES, data_schema, select_schema

# The first round's files are the attempts table's files (engine/rounds.py), one per
# partition. Fewer, bigger tasks write faster and make fewer files; the cap bounds what a
# failed task has to redo on a cluster.
ROWS_PER_PARTITION = 64_000_000
_ARRIVAL_STREAM = "arrival"
# A traffic shape's ids are made by exploding runs of at most this many ids.
PIECE_IDS = 1 << 20
_RUNS_SCHEMA = "start long, length long, first long, count long, low long, high long"


def partitions_for(spark: SparkSession, rows: int) -> int:
    """Enough partitions to use every core, and to keep each one a few million rows at most;
    a multiple of the cores, so that the last wave of tasks does not leave cores idle."""
    cores = spark.sparkContext.defaultParallelism
    return cores * max(1, math.ceil(rows / ROWS_PER_PARTITION / cores))


def messages_df(spark: SparkSession, group: Group, seed: int) -> DataFrame:
    """One row per message of ``group``, in the ``messages`` table's shape (no run_id)."""
    workload = group.workload
    pieces = workload.pieces
    if len(pieces) == 1:
        ids = spark.range(
            0, workload.messages, numPartitions=partitions_for(spark, workload.messages)
        )
        ids = ids.select(
            F.col("id"), *(F.lit(v).alias(n) for n, v in zip(_PIECE, pieces[0], strict=True))
        )
    else:
        ids = _piece_ids(spark, pieces, workload.messages)
    msg_id = F.col("id")
    if workload.spread == "uniform":
        offset = F.floor((msg_id - F.col("first")) * F.col("length") / F.col("count"))
    else:
        offset = F.floor(uniform(seed, group.name, _ARRIVAL_STREAM, msg_id) * F.col("length"))
    return select_schema(
        ids.withColumn("group", F.lit(group.name))
        .withColumn("topic", F.lit(group.source_topic))
        .withColumn("msg_id", msg_id)
        .withColumn("queue_id", (msg_id % F.lit(workload.queues)).cast("int"))
        .withColumn("born_ms", (F.col("start") + offset).cast("long"))
        .withColumn("size_bytes", F.lit(workload.size_bytes)),
        data_schema(MESSAGES),
    )


_PIECE = ("start", "length", "first", "count")


def _piece_ids(spark: SparkSession, pieces: Sequence[Piece], messages: int) -> DataFrame:
    """Every message id with its piece's columns: the pieces cut into runs of at most
    PIECE_IDS ids, spread over the partitions in id order, each run exploded into its ids
    (a profile of any length costs one row per run, not a lookup per message)."""
    runs = [
        (start, length, first, count, low, min(low + PIECE_IDS, first + count))
        for start, length, first, count in pieces
        for low in range(first, first + count, PIECE_IDS)
    ]
    slices = min(len(runs), partitions_for(spark, messages))
    frame = spark.sparkContext.parallelize(runs, slices).toDF(_RUNS_SCHEMA)
    return frame.select(*_PIECE, F.explode(F.sequence(F.col("low"), F.col("high") - 1)).alias("id"))


def all_messages(
    spark: SparkSession, scenario: Scenario, groups: list[Group] | None = None
) -> DataFrame:
    """Every group's messages (of ``groups``, else the scenario's), one DataFrame in the
    ``messages`` table's shape without its run_id."""
    chosen = groups if groups is not None else list(scenario.groups)
    frames = [messages_df(spark, group, scenario.seed) for group in chosen]
    return reduce(DataFrame.unionByName, frames)


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
    table = np.array(workload.pieces, dtype=np.int64).reshape(-1, 4)
    index = np.searchsorted(table[:, 2], msg_ids, side="right") - 1
    start, length, first, count = (table[index, k] for k in range(4))
    if workload.spread == "uniform":
        offset = np.floor(((msg_ids - first) * length).astype(np.float64) / count)
    else:
        offset = np.floor(uniform_np(seed, group, _ARRIVAL_STREAM, msg_ids) * length)
    return msg_ids, msg_ids % workload.queues, (start + offset.astype(np.int64)).astype(np.int64)


def peak_rate_per_ms(workload: Workload) -> float:
    """The highest arrival rate of any piece, in messages per millisecond (the uniform rate
    of a workload without a shape)."""
    return max((count / length if length else math.inf) for _, length, _, count in workload.pieces)
