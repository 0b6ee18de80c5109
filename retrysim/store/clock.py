"""Simulated times on a real clock: a scenario's ``start_at`` is the moment its time 0
stands for, and each moment a table keeps in milliseconds gets a timestamp beside it
(``start_ms`` -> ``start_ts``), so a run lays over production metrics.

The timestamps are not stored: one ``start_at`` per run (``runs.start_at``) gives them all
exactly, and storing them would add six columns to the attempts table, whose files the
engine writes and the publish moves as they are. The SQL views (``register_views``) carry
them; :func:`on_clock` adds them to any DataFrame of a table; outside Spark the same join
is one line of SQL (docs/cluster.md, "Outside Spark").
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from retrysim.store.sinks import read_table
from retrysim.tables.schemas import PARTITION_COLUMN

# Each table's moments, in milliseconds since the scenario's start.
TIME_COLUMNS: dict[str, tuple[str, ...]] = {
    "messages": ("born_ms",),
    "attempts": ("born_ms", "ready_ms", "start_ms", "end_ms", "next_ready_ms", "settled_ms"),
    "transitions": ("at_ms",),
    "dead_letters": ("dlq_at_ms", "replayed_at_ms"),
    "load": ("bucket_start_ms",),
    "instance_load": ("bucket_start_ms",),
}
_START = "__start_at_us"

__all__ = ["TIME_COLUMNS", "clock_name", "on_clock"]


def clock_name(column: str) -> str:
    """The timestamp beside a moment in milliseconds: ``start_ms`` -> ``start_ts``."""
    return column.removesuffix("_ms") + "_ts"


def on_clock(spark: SparkSession, output: str, rows: DataFrame, table: str) -> DataFrame:
    """``rows`` of ``table`` (with its ``run_id``) with a timestamp beside each moment in
    milliseconds: its run's ``start_at`` plus the milliseconds, null where the run gave no
    ``start_at`` or the moment is null. Other tables come back as they are."""
    moments = [name for name in TIME_COLUMNS.get(table, ()) if name in rows.columns]
    if not moments:
        return rows
    starts = (
        read_table(spark, output, "runs", complete_only=False)
        .select(PARTITION_COLUMN, F.unix_micros("start_at").alias(_START))
        .dropDuplicates([PARTITION_COLUMN])  # one row a run; never multiply the rows
    )
    joined = rows.join(F.broadcast(starts), PARTITION_COLUMN, "left")
    columns = []
    for name in rows.columns:
        columns.append(F.col(name))
        if name in moments:  # in microseconds, as start_at is kept
            moment = F.timestamp_micros(F.col(_START) + F.col(name) * 1000)
            columns.append(moment.alias(clock_name(name)))
    return joined.select(*columns)
