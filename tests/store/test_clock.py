"""Simulated times on a real clock (docs/scenario.md, "start_at"): a run whose scenario
gives ``start_at`` stores it in ``runs``, and every moment in milliseconds gets its timestamp
beside it in the SQL views, from ``on_clock``, and from the one line of SQL docs/cluster.md
gives DuckDB; a run without ``start_at`` gets nulls there."""

from __future__ import annotations

import datetime as dt

import duckdb
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F
from support import retrying_scenario

from retrysim import ScenarioError, complete_files, load_scenario, on_clock, register_views
from retrysim.runner import simulate
from retrysim.store.clock import TIME_COLUMNS, clock_name
from retrysim.store.sinks import read_table, run_rows, table_path
from retrysim.tables.schemas import SCHEMAS

START = dt.datetime(2026, 11, 27, 8, 0, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def output(spark, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("clock") / "out")
    base = retrying_scenario("clock", seed=4, messages=60)
    simulate(spark, base.model_copy(update={"start_at": START}), output=folder,
             run_id="on-clock", validate=False)  # fmt: skip
    simulate(spark, base, output=folder, run_id="no-clock", validate=False)
    return folder


def test_the_run_stores_its_start_and_every_view_puts_each_moment_beside_it(spark, output):
    starts = {r["run_id"]: r["start_at"] for r in read_table(spark, output, "runs").collect()}
    assert starts["no-clock"] is None and starts["on-clock"] is not None
    register_views(spark, output)
    for table in SCHEMAS:
        columns = spark.table(table).columns
        for moment in TIME_COLUMNS.get(table, ()):
            assert columns[columns.index(moment) + 1] == clock_name(moment), (table, moment)
    rows = spark.sql(
        "SELECT run_id, start_ms, start_ts, settled_ms, settled_ts FROM attempts "
        "WHERE start_ms IS NOT NULL"
    ).collect()
    assert {r["run_id"] for r in rows} == {"on-clock", "no-clock"}
    for row in rows:
        for moment in ("start", "settled"):
            ms, ts = row[f"{moment}_ms"], row[f"{moment}_ts"]
            if row["run_id"] == "no-clock" or ms is None:
                assert ts is None
            else:
                assert ts.replace(tzinfo=None) == (
                    START + dt.timedelta(milliseconds=ms)
                ).astimezone().replace(tzinfo=None)  # collect() gives Python's local time


def test_on_clock_adds_the_timestamps_to_any_frame_of_a_table(spark, output):
    load = read_table(spark, output, "load").where(F.col("run_id") == "on-clock")
    clocked = on_clock(spark, output, load, "load")
    expected = load.withColumn(
        "bucket_start_ts",
        F.timestamp_millis(F.lit(int(START.timestamp() * 1000)) + F.col("bucket_start_ms")),
    ).select(clocked.columns)
    assert_df_equality(clocked, expected, ignore_row_order=True, ignore_nullable=True)
    summary = read_table(spark, output, "summary")
    assert on_clock(spark, output, summary, "summary").columns == summary.columns  # no moments


def test_duckdb_puts_the_same_moments_on_the_clock(spark, output):
    """The one line of SQL docs/cluster.md gives readers outside Spark."""
    con = duckdb.connect()
    for table in ("runs", "attempts"):
        files = complete_files(output, table)
        con.register(table, con.read_parquet(files, hive_partitioning=True))
    con.register("clocked", con.sql(
        "SELECT a.run_id, a.start_ms, r.start_at + to_milliseconds(a.start_ms) AS start_ts "
        "FROM attempts a JOIN runs r USING (run_id) WHERE a.start_ms IS NOT NULL"
    ))  # fmt: skip
    # as epoch milliseconds: Python's zoned timestamps from DuckDB need pytz
    joined = con.sql("SELECT run_id, start_ms, epoch_ms(start_ts) FROM clocked").fetchall()
    assert {run_id for run_id, _, _ in joined} == {"on-clock", "no-clock"}
    for run_id, start_ms, start_ts in joined:
        if run_id == "no-clock":
            assert start_ts is None
        else:
            assert start_ts == int(START.timestamp() * 1000) + start_ms


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("2026-11-27T08:00:00Z", START),
        ("2026-11-27 09:00:00+01:00", START),
        ("2026-11-27T08:00:00", START),  # no zone: UTC
    ],
)
def test_start_at_takes_an_iso_timestamp_on_utc(given, expected):
    assert load_scenario(overrides=[f"start_at={given}"]).start_at == expected


def test_a_start_at_that_is_no_timestamp_names_the_field():
    for wrong in ("yesterday", "2026-13-01T00:00:00Z", "12"):  # a number is no timestamp
        with pytest.raises(ScenarioError, match=rf"^start_at: value '?{wrong}'?: expected an ISO"):
            load_scenario(overrides=[f"start_at={wrong}"])


def test_a_folder_written_before_start_at_existed_still_reads(spark, output, tmp_path):
    """An older version wrote runs without start_at: readers give it as null (the writers
    refuse such a folder, as for any column change)."""
    old = tmp_path / "old"
    for table in ("runs", "attempts"):
        rows = DeltaTable(table_path(output, table)).to_pyarrow_table(
            partitions=[("run_id", "=", "no-clock")]
        )
        if table == "runs":
            rows = rows.drop_columns(["start_at"])
        write_deltalake(table_path(str(old), table), rows, partition_by=["run_id"])
    (row,) = run_rows(str(old), "runs", "no-clock")
    assert row["start_at"] is None and row["status"] == "complete"
    clocked = on_clock(spark, str(old), read_table(spark, str(old), "attempts"), "attempts")
    assert clocked.where(F.col("start_ts").isNotNull()).count() == 0 < clocked.count()
