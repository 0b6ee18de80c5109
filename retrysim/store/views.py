"""Reading runs back, whichever tables they stored.

A lean run (``--tables lean``) does not store ``transitions`` or ``messages``: both follow
from what it does store. Transitions come from the attempts rows (each carries how it
entered Ready and left Inflight); messages are regenerated from the scenario in the ``runs``
row, since the workload is a pure function of the scenario and its seed. The readers here
give every run's rows the same way, so notebooks and SQL need not know how a run was written.

>>> register_views(spark, "out")  # doctest: +SKIP
>>> spark.sql("SELECT state, count(*) FROM transitions GROUP BY state").show()  # doctest: +SKIP
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from retrysim.model.workload import all_messages
from retrysim.scenario.loading import scenario_from_json
from retrysim.store.clock import on_clock
from retrysim.store.sinks import read_table
from retrysim.tables.schemas import (
    DERIVED_IN_LEAN,
    MESSAGES,
    PARTITION_COLUMN,
    SCHEMAS,
    select_schema,
    without_comments,
)
from retrysim.tables.transitions import transitions_from_attempts

LEAN, FULL = "lean", "full"


def lean_runs(spark: SparkSession, output: str) -> list[tuple[str, str]]:
    """(run_id, config_json) of every lean run in ``output`` (one small row per run)."""
    runs = read_table(spark, output, "runs").where(F.col("tables") == F.lit(LEAN))
    return [(r[PARTITION_COLUMN], r["config_json"]) for r in runs.collect()]


def derived(spark: SparkSession, output: str, table: str, runs: list[tuple[str, str]]) -> DataFrame:
    """``table`` (transitions or messages) of the given lean runs, derived."""
    ids = [run_id for run_id, _ in runs]
    if table == "transitions":
        attempts = read_table(spark, output, "attempts").where(F.col(PARTITION_COLUMN).isin(ids))
        return transitions_from_attempts(attempts)
    messages = spark.createDataFrame([], without_comments(MESSAGES))
    for run_id, config in runs:
        regenerated = all_messages(spark, scenario_from_json(config))
        messages = messages.unionByName(
            select_schema(regenerated.withColumn(PARTITION_COLUMN, F.lit(run_id)), MESSAGES)
        )
    return messages


def table(spark: SparkSession, output: str, name: str, run_id: str | None = None) -> DataFrame:
    """Every run's rows of table ``name`` (or one run's), derived where a run did not store it."""
    stored = read_table(spark, output, name)
    if run_id is not None:
        stored = stored.where(F.col(PARTITION_COLUMN) == F.lit(run_id))
    if name not in DERIVED_IN_LEAN:
        return stored
    lean = [run for run in lean_runs(spark, output) if run_id is None or run[0] == run_id]
    return stored.unionByName(derived(spark, output, name, lean)) if lean else stored


def register_views(spark: SparkSession, output: str) -> list[str]:
    """A temporary SQL view per table of ``output``, named after it (``transitions`` and
    ``messages`` include the lean runs' derived rows), each moment in milliseconds with its
    timestamp beside it (:func:`retrysim.store.clock.on_clock`). Returns the view names."""
    for name in SCHEMAS:
        on_clock(spark, output, table(spark, output, name), name).createOrReplaceTempView(name)
    return list(SCHEMAS)
