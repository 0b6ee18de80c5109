"""Content digests of one run's tables, to prove two runs produced the same results.

``table_digests(spark, output, run_id)`` gives, per table, the run's row count and an
order-independent digest of its rows: each row is hashed with Spark's ``xxhash64`` over
its columns, and the hashes are summed modulo 2^64. A sum does not depend on row order or
partitioning, and unlike XOR it does not cancel duplicated rows. The sum is taken as a
decimal because Spark 4 runs in ANSI mode, where a plain ``long`` sum fails on overflow.
Only one row per table reaches the driver; message-level rows are never collected.

Every column of :data:`retrysim.tables.SCHEMAS` is hashed (so new columns are covered
without touching this module) except those that legitimately differ between two runs of
the same scenario (see :data:`EXCLUDED` and :func:`digest_columns`):

* ``run_id`` in every table: the name of the run, not a result;
* every ``TimestampType`` column: simulated time is integer milliseconds (``*_ms``) by
  design, so a timestamp is wall-clock time of the run (``runs.started_at``,
  ``runs.finished_at``, and any such column added later);
* ``runs.spark_master``: where the run was executed (``local[2]``, ``spark://...``).

Kept on purpose: ``runs.scenario``, ``seed`` and ``config_json`` (what was simulated),
``status``, ``engine_version`` and ``rounds``. The last two are the same for every run of
one build; comparing runs of different engine versions, expect ``runs`` alone to differ.

Null-safety: Spark's hash skips null inputs, so each column is preceded by its own
``isnull`` flag; ``(null, 1)`` and ``(1, null)`` then hash differently.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from retrysim.config import ScenarioError
from retrysim.sinks import read_table, table_path
from retrysim.tables import PARTITION_COLUMN, SCHEMAS

MODULUS = 2**64
# Columns never hashed, per table ("*": every table). TimestampType columns are excluded too.
EXCLUDED: dict[str, frozenset[str]] = {
    "*": frozenset({PARTITION_COLUMN}),
    "runs": frozenset({"spark_master"}),
}
_DECIMAL = T.DecimalType(38, 0)


def digest_columns(table: str) -> list[str]:
    """The columns of ``table`` that go into its digest, in schema order."""
    skip = EXCLUDED["*"] | EXCLUDED.get(table, frozenset())
    return [
        field.name
        for field in SCHEMAS[table].fields
        if field.name not in skip and not isinstance(field.dataType, T.TimestampType)
    ]


def row_hash(columns: Iterable[str]) -> Column:
    """xxhash64 of a row over ``columns``, each preceded by its null flag."""
    parts: list[Column] = []
    for name in columns:
        parts += [F.col(name).isNull(), F.col(name)]
    if not parts:
        return F.lit(0).cast("long")
    return F.xxhash64(*parts)


def _hashed(df: DataFrame, columns: list[str], label: str) -> DataFrame:
    return df.select(F.lit(label).alias("label"), row_hash(columns).alias("h"))


def _format(total: object) -> str:
    return f"{int(total or 0) % MODULUS:016x}"


def frame_digest(df: DataFrame, columns: list[str]) -> tuple[int, str]:
    """Row count and digest (16 hex digits) of ``df`` over ``columns``."""
    row = (
        _hashed(df, columns, "")
        .agg(F.count(F.lit(1)).alias("rows"), F.sum(F.col("h").cast(_DECIMAL)).alias("total"))
        .first()
    )
    return int(row["rows"]), _format(row["total"])


def table_digests(spark: SparkSession, output: str, run_id: str) -> dict[str, tuple[int, str]]:
    """Per table of the run ``run_id`` under ``output``: (row count, content digest).

    All seven tables are hashed in one Spark job (a union of per-table row hashes, grouped
    by table); a table without rows for the run gets ``(0, "0000000000000000")``.
    """
    frames = [
        _hashed(
            read_table(spark, output, table).where(F.col(PARTITION_COLUMN) == F.lit(run_id)),
            digest_columns(table),
            table,
        )
        for table in SCHEMAS
    ]
    combined = frames[0]
    for frame in frames[1:]:
        combined = combined.unionByName(frame)
    rows = (
        combined.groupBy("label")
        .agg(F.count(F.lit(1)).alias("rows"), F.sum(F.col("h").cast(_DECIMAL)).alias("total"))
        .collect()
    )
    found = {row["label"]: (int(row["rows"]), _format(row["total"])) for row in rows}
    return {table: found.get(table, (0, _format(0))) for table in SCHEMAS}


def format_digests(digests: dict[str, tuple[int, str]]) -> str:
    """One line per table: ``name rows digest``, aligned, for the terminal and for diff."""
    width = max(len(table) for table in digests)
    return "\n".join(
        f"{table:<{width}}  {rows:>12}  {digest}" for table, (rows, digest) in digests.items()
    )


# --------------------------------------------------------------------------- command line


def add_digest_command(commands: argparse._SubParsersAction) -> None:
    """``retrysim digest --output DIR --run-id ID`` (wired into retrysim.cli)."""
    command = commands.add_parser(
        "digest",
        help="print each table's row count and content digest for one run",
        description="Print, per table, the run's row count and an order-independent digest "
        "of its rows (run-specific columns excluded); two runs with equal lines produced "
        "the same results.",
    )
    command.add_argument("--output", required=True, help="folder of the Delta tables")
    command.add_argument("--run-id", required=True, help="the run to digest")


def digest_command(args: argparse.Namespace) -> int:
    from deltalake import DeltaTable

    from retrysim.session import build_session

    output = os.path.abspath(args.output)
    runs = table_path(output, "runs")
    if not DeltaTable.is_deltatable(runs):
        raise ScenarioError("--output", f"no retrysim tables in {output} (no Delta table {runs})")
    spark = build_session("retrysim:digest", conf={"spark.ui.enabled": "false"})
    try:
        digests = table_digests(spark, output, args.run_id)
    finally:
        spark.stop()
    if digests["runs"][0] == 0:
        raise ScenarioError("--run-id", f"no run {args.run_id!r} in {runs}")
    print(format_digests(digests), flush=True)
    return 0
