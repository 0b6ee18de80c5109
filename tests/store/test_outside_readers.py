"""Readers outside Spark see exactly the complete runs (docs/cluster.md, "Reading the tables").

Three runs under one output: one complete, one published twice (its first files stay on
disk until a vacuum), and one half-published (its ``runs`` row says ``publishing`` and its
attempts are there, as a writer that died between two commits leaves them). DuckDB and
Polars, reading ``retrysim.complete_files`` with hive partitioning, and Polars' Delta reader
joined on the complete runs, count per run exactly what ``read_table`` shows; a glob of the
folders, without the Delta log, counts the run published twice twice, and a reader of the
log alone sees the half-published run.
"""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from support import retrying_scenario

from retrysim import complete_files
from retrysim.runner import simulate
from retrysim.store.sinks import STATUS_PUBLISHING, read_table, table_path

SCENARIO = retrying_scenario("readers", seed=9, messages=150)


def _half_published(output: str, source: str, run_id: str) -> None:
    """``run_id`` as a writer that died while publishing leaves it: its runs row says
    publishing, its attempts are committed (a copy of ``source``'s), nothing else."""
    for table, status in (("runs", STATUS_PUBLISHING), ("attempts", None)):
        path = table_path(output, table)
        rows = DeltaTable(path).to_pyarrow_table(partitions=[("run_id", "=", source)])
        rows = rows.set_column(rows.schema.get_field_index("run_id"), "run_id",
                               pa.array([run_id] * rows.num_rows))  # fmt: skip
        if status is not None:
            rows = rows.set_column(rows.schema.get_field_index("status"), "status",
                                   pa.array([status] * rows.num_rows))  # fmt: skip
        write_deltalake(path, rows, mode="append", partition_by=["run_id"])


@pytest.fixture(scope="module")
def output(spark, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("readers") / "out")
    scenario = SCENARIO
    for run_id in ("kept", "twice", "twice"):
        simulate(spark, scenario, output=folder, run_id=run_id, validate=False)
    _half_published(folder, "kept", "half")
    return folder


def _expected(spark, output: str) -> dict[str, int]:
    rows = read_table(spark, output, "attempts").groupBy("run_id").count().collect()
    return {row["run_id"]: row["count"] for row in rows}


def test_duckdb_and_polars_count_exactly_the_complete_runs(spark, output):
    expected = _expected(spark, output)
    assert set(expected) == {"kept", "twice"}

    files = complete_files(output, "attempts")
    relation = duckdb.read_parquet(files, hive_partitioning=True)
    counted = relation.aggregate("run_id, count(*)", "run_id").fetchall()
    assert dict(counted) == expected

    frame = pl.scan_parquet(files, hive_partitioning=True)
    by_run = frame.group_by("run_id").agg(pl.len()).collect()
    assert dict(by_run.iter_rows()) == expected

    complete = pl.read_delta(table_path(output, "runs")).filter(pl.col("status") == "complete")
    joined = pl.read_delta(table_path(output, "attempts")).join(
        complete.select("run_id"), on="run_id", how="semi"
    )
    assert dict(joined.group_by("run_id").agg(pl.len()).iter_rows()) == expected


def test_without_the_log_or_the_join_a_reader_miscounts(output, spark):
    expected = _expected(spark, output)
    glob = f"{table_path(output, 'attempts')}/*/*.parquet"
    counted = dict(
        duckdb.sql(
            f"SELECT run_id, count(*) FROM read_parquet('{glob}', hive_partitioning = true) "
            "GROUP BY run_id"
        ).fetchall()
    )
    assert counted["twice"] == 2 * expected["twice"]  # the first publish's files too
    log_only = pl.read_delta(table_path(output, "attempts"))
    assert "half" in set(log_only["run_id"])
