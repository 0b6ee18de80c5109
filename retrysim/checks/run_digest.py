"""Content digests of one run's tables, to prove two runs produced the same results.

Per table: the run's row count and the sum modulo 2^64 of its rows' ``xxhash64`` (a sum
does not depend on row order or partitioning and, unlike XOR, does not cancel duplicates;
a decimal sum, because ANSI mode fails a long sum on overflow). Every column is hashed but
those that legitimately differ between two runs of one scenario (:data:`EXCLUDED`, and
every timestamp: wall-clock time of the run), each after its own null flag. One row per
table reaches the driver.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from retrysim.store.sinks import read_table
from retrysim.tables.schemas import PARTITION_COLUMN, SCHEMAS

MODULUS = 2**64
# Columns never hashed, per table ("*": every table): run_id names the run (and runs'
# replication_of, point and replication where it belongs among replications: a plan point
# and a simulate of the same scenario and seed are the same tables), spark_master says
# where it ran, and
# TimestampType columns are wall-clock time (simulated time is *_ms); runs.start_at copies
# the scenario's start_at, which config_json holds and the digest counts there.
# Kept on purpose: runs.engine_version and rounds, the same for every run of one build.
EXCLUDED: dict[str, frozenset[str]] = {
    "*": frozenset({PARTITION_COLUMN}),
    "runs": frozenset({"spark_master", "replication_of", "point", "replication"}),
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

    All eight tables are hashed in one Spark job (a union of per-table row hashes, grouped
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
