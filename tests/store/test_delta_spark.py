"""delta-spark, the default sink, against delta-rs and as a Delta user reaches the tables.

* one scenario and seed committed by each sink gives the same contents, table by table
  (digests), and each sink's commits say which engine made them;
* a folder either sink began is continued by the other, at the protocol delta-rs, DuckDB
  and Polars read (reader 1, writer 2: no deletion vectors, no column mapping), and every
  table delta-spark wrote reads the same without Spark;
* a batch of runs is one commit a table whose userMetadata names them (``DESCRIBE
  HISTORY``), ``VERSION AS OF`` that commit reads a run as it was published, until a vacuum
  removes its files;
* ``retrysim runs delete | optimize | vacuum`` commit through delta-spark where it is the
  sink, and the rows stay exactly what they were.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql import functions as F
from support import group, scenario
from test_sinks import SCENARIO

from retrysim import complete_files
from retrysim.checks.run_digest import table_digests
from retrysim.cli.main import main
from retrysim.runner import RunRequest, simulate, simulate_runs
from retrysim.scenario.spec import Scenario
from retrysim.store.sinks import (
    DeltaSparkSink,
    published_versions,
    read_table,
    table_path,
)
from retrysim.tables.schemas import SCHEMAS, TABLE_ORDER


def small(seed: int) -> Scenario:
    """A small group that retries and reaches the DLQ, on a finite pool: simulated event by
    event in one Spark stage (a run of a second or two, where rounds take a stage each)."""
    pay = group(
        "pay", max_reconsume_times=2, consumers={"instances": 2, "threads": 4},
        workload={"messages": 120, "over": "1m", "queues": 2},
        behavior={"fail_probability": 0.3, "processing_time": "10ms"},
    )  # fmt: skip
    return scenario(pay, name="sinks", seed=seed, horizon="20m", load_bucket="1m")


SMALL = small(3)
SPARK_ENGINE, RS_ENGINE = "Delta-Lake/", "delta-rs"


def engines(output: Path | str, table: str) -> set[str]:
    """Which engine made each commit of ``table``: delta-spark's engineInfo names Delta Lake,
    delta-rs' commits name delta-rs."""
    found = set()
    for commit in DeltaTable(table_path(str(output), table)).history():
        made_by = f"{commit.get('engineInfo', '')} {commit.get('clientVersion', '')}"
        found.add(SPARK_ENGINE if SPARK_ENGINE in made_by else made_by.strip())
    return found


def notes(output: Path | str, table: str) -> list[dict]:
    """The userMetadata of each commit of ``table``, oldest first."""
    history = DeltaTable(table_path(str(output), table)).history()
    return [json.loads(c["userMetadata"]) for c in sorted(history, key=lambda c: c["version"])]


@pytest.fixture(scope="module")
def by_sink(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("sinks")
    for sink in ("delta-rs", "delta-spark"):  # checked once: the check runs before either
        simulate(spark, SCENARIO, output=str(root / sink), run_id="same", sink=sink,
                 validate=sink == "delta-spark")  # fmt: skip
    return root


def test_both_sinks_commit_the_same_tables(spark, by_sink):
    digests = {sink: table_digests(spark, str(by_sink / sink), "same") for sink in
               ("delta-rs", "delta-spark")}  # fmt: skip
    assert list(digests["delta-spark"]) == list(SCHEMAS)
    assert digests["delta-spark"] == digests["delta-rs"]
    assert all(rows > 0 for rows, _ in digests["delta-spark"].values())
    for table in TABLE_ORDER:
        assert engines(by_sink / "delta-spark", table) == {SPARK_ENGINE}, table
        assert RS_ENGINE in " ".join(engines(by_sink / "delta-rs", table)), table


@pytest.mark.parametrize("first, then", [("delta-rs", "delta-spark"), ("delta-spark", "delta-rs")])
def test_each_sink_continues_a_folder_the_other_began(spark, tmp_path, first, then):
    output = str(tmp_path / "out")
    simulate(spark, SMALL, output=output, run_id="one", sink=first, validate=False)
    simulate(spark, SMALL, output=output, run_id="two", sink=then, validate=False)
    simulate(spark, SMALL, output=output, run_id="one", sink=then, validate=False)  # replaced
    for table in TABLE_ORDER:
        delta = DeltaTable(table_path(output, table))
        protocol = delta.protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), table
        assert not protocol.writer_features and not protocol.reader_features, table
        assert delta.metadata().configuration.get("delta.enableDeletionVectors") == "false"
        assert engines(output, table) == {SPARK_ENGINE, *engines(output, table) - {SPARK_ENGINE}}
    counts = read_table(spark, output, "attempts").groupBy("run_id").count().collect()
    assert {row["run_id"]: row["count"] for row in counts}["one"] == dict(
        (row["run_id"], row["count"]) for row in counts
    )["two"]
    assert table_digests(spark, output, "one") == table_digests(spark, output, "two")


@pytest.mark.parametrize("sink", ["delta-spark", "delta-rs"])
def test_describe_table_explains_every_column(spark, by_sink, sink):
    """The schema constants' comments, as DESCRIBE TABLE shows them on a path table."""
    for table in SCHEMAS:
        shown = spark.sql(f"DESCRIBE TABLE delta.`{table_path(str(by_sink / sink), table)}`")
        comments = {row["col_name"]: row["comment"] for row in shown.collect()
                    if row["col_name"] and not row["col_name"].startswith("#")}  # fmt: skip
        expected = {f.name: f.metadata["comment"] for f in SCHEMAS[table].fields}
        assert comments == expected, table


def test_readers_without_spark_read_every_table_delta_spark_wrote(spark, by_sink):
    output = str(by_sink / "delta-spark")
    for table in SCHEMAS:
        expected = read_table(spark, output, table).count()
        assert expected > 0, table
        assert DeltaTable(table_path(output, table)).to_pyarrow_table().num_rows == expected
        files = complete_files(output, table)
        scanned = duckdb.sql(
            f"SELECT count(*) FROM read_parquet({files!r}, hive_partitioning = true)"
        ).fetchone()[0]
        assert scanned == expected, table
        assert pl.read_delta(table_path(output, table)).height == expected, table


def test_a_batch_is_one_commit_a_table_naming_its_runs_and_time_travel_reads_it(spark, tmp_path):
    output = str(tmp_path / "out")
    batch = [RunRequest(SMALL, f"b{i}") for i in range(3)]
    simulate_runs(spark, batch, output=output, validate=False, sink="delta-spark")
    ids = ["b0", "b1", "b2"]
    assert notes(output, "runs") == [
        {"step": "publishing", "run_ids": ids}, {"step": "complete", "run_ids": ids}
    ]  # fmt: skip
    for table in TABLE_ORDER:
        if table != "runs":
            assert notes(output, table) == [{"step": "publish", "run_ids": ids}], table
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table_path(output, 'attempts')}`")
    assert [json.loads(row["userMetadata"])["run_ids"] for row in history.collect()] == [ids]

    # b1 again under another seed: its rows change, and the version that published the
    # first ones still reads them
    path = table_path(output, "attempts")
    before = read_table(spark, output, "attempts").where("run_id = 'b1'")
    before = spark.createDataFrame(before.collect(), before.schema)  # kept, not re-read
    simulate(spark, small(4), output=output, run_id="b1", sink="delta-spark", validate=False)
    assert published_versions(output, "attempts", "b1") == [0, 1]
    now = read_table(spark, output, "attempts").where("run_id = 'b1'")
    assert now.exceptAll(before).count() > 0, "the second seed's rows differ"
    first = spark.sql(f"SELECT * FROM delta.`{path}` VERSION AS OF 0 WHERE run_id = 'b1'")
    assert_df_equality(first.select(*before.columns), before, ignore_row_order=True,
                       ignore_nullable=True, ignore_metadata=True)  # fmt: skip

    # a vacuum that keeps no history removes the replaced files: version 0 is gone
    args = ["runs", "vacuum", "--output", output, "--retention", "0h", "--force"]
    assert main([*args, "--delta-sink", "delta-spark"]) == 0
    with pytest.raises(Exception, match=r"(?i)not exist|FileNotFound|not found"):
        spark.sql(f"SELECT * FROM delta.`{path}` VERSION AS OF 0").collect()
    assert read_table(spark, output, "attempts").where("run_id = 'b1'").count() == now.count()


def test_runs_delete_optimize_and_vacuum_go_through_delta_spark(spark, tmp_path, capsys):
    output = str(tmp_path / "out")
    for run_id in ("keep", "gone", "more"):
        simulate(spark, SMALL, output=output, run_id=run_id, sink="delta-spark", validate=False)
    digest = table_digests(spark, output, "keep")
    files_before = len(DeltaTable(table_path(output, "attempts")).file_uris())

    assert main(["runs", "delete", "--output", output, "--run-id", "gone"]) == 0
    assert "through delta-spark" in capsys.readouterr().out
    for table in TABLE_ORDER:
        operations = [c["operation"] for c in DeltaTable(table_path(output, table)).history()]
        assert operations[0] == "DELETE", (table, operations)
        assert notes(output, table)[-1] == {"step": "remove", "run_ids": ["gone"]}
    shown = read_table(spark, output, "runs").select("run_id").collect()
    assert sorted(row[0] for row in shown) == ["keep", "more"]

    assert main(["runs", "optimize", "--output", output, "--zorder"]) == 0
    said = capsys.readouterr().out
    assert "attempts:" in said and "through delta-spark" in said
    attempts = DeltaTable(table_path(output, "attempts"))
    assert attempts.history()[0]["operation"] == "OPTIMIZE"
    assert "group" in json.loads(attempts.history()[0]["operationParameters"]["zOrderBy"])
    assert len(attempts.file_uris()) <= files_before
    assert table_digests(spark, output, "keep") == digest
    files = complete_files(output, "attempts")
    scanned = duckdb.sql(f"SELECT count(*) FROM read_parquet({files!r})").fetchone()[0]
    assert scanned == read_table(spark, output, "attempts").count()

    assert main(["runs", "vacuum", "--output", output, "--retention", "0h"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("retrysim: error: --retention: value 0h is shorter")
    assert main(["runs", "vacuum", "--output", output, "--retention", "0h", "--force"]) == 0
    on_disk = {str(p) for p in Path(output).glob("*/run_id=*/*.parquet")}
    referenced = {
        uri.removeprefix("file://")
        for table in TABLE_ORDER
        for uri in DeltaTable(table_path(output, table)).file_uris()
    }
    assert on_disk == referenced
    assert not any("run_id=gone" in path for path in on_disk)
    assert read_table(spark, output, "attempts").where(F.col("run_id") == "keep").count() > 0


def test_a_table_past_its_checkpoint_still_commits_and_reads(spark, tmp_path):
    """Delta writes a checkpoint every ten commits and reads it back at the next: the
    delta-spark JARs and pyspark must agree on Spark's classes there (delta-spark 4.1.0 and
    Spark 4.1.2 do not: a NoSuchMethodError that stops the SparkContext)."""
    output = str(tmp_path / "out")
    staged = tmp_path / "staged"
    columns = "group string, topic string, msg_id long, queue_id int, born_ms long, size_bytes int"
    row = spark.createDataFrame([("g", "t", 0, 0, 0, 1)], columns)
    for k in range(12):
        row.write.mode("overwrite").parquet(str(staged / str(k)))
        DeltaSparkSink().publish(spark, output, "messages", str(staged / str(k)), f"r{k % 3}")
    log = Path(table_path(output, "messages")) / "_delta_log"
    assert list(log.glob("*.checkpoint.parquet")), "ten commits make a checkpoint"
    counts = spark.read.format("delta").load(table_path(output, "messages")).groupBy("run_id")
    assert sorted(tuple(r) for r in counts.count().collect()) == [("r0", 1), ("r1", 1), ("r2", 1)]
    assert spark.sql(f"DESCRIBE HISTORY delta.`{table_path(output, 'messages')}`").count() == 12


def test_the_log_store_gives_each_version_to_one_writer(spark, tmp_path):
    """The sessions commit file: tables through retrysim's log store (jvm/delta): of several
    writers of one version exactly one creates it, whole; the others get the
    FileAlreadyExistsException Delta retries on; the commit files come without Hadoop's
    checksum files beside them (the processes they cost), each version with Delta's own
    checksum (a new JVM reads the table's protocol and metadata from it)."""
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.delta.logStore.file.impl") == "retrysim.delta.LocalFileLogStore"
    jvm = spark._jvm
    hadoop = spark._jsc.hadoopConfiguration()
    version = jvm.org.apache.hadoop.fs.Path(
        str(tmp_path / "_delta_log" / "00000000000000000000.json")
    )
    stores = [jvm.retrysim.delta.LocalFileLogStore(hadoop) for _ in range(3)]
    outcomes = []
    for k, store in enumerate(stores):
        lines = jvm.java.util.ArrayList()
        lines.add(f'{{"writer":{k}}}')
        try:
            store.write(version, lines.iterator(), False, hadoop)
            outcomes.append("wrote")
        except Exception as error:  # py4j carries the Java exception's class name
            outcomes.append("refused" if "FileAlreadyExistsException" in str(error) else error)
    assert outcomes == ["wrote", "refused", "refused"]
    assert (tmp_path / "_delta_log" / "00000000000000000000.json").read_text() == '{"writer":0}\n'
    assert [p.name for p in (tmp_path / "_delta_log").iterdir()] == ["00000000000000000000.json"]

    output = str(tmp_path / "out")
    simulate(spark, SMALL, output=output, run_id="one", sink="delta-spark", validate=False)
    simulate(spark, SMALL, output=output, run_id="one", sink="delta-spark", validate=False)
    log = Path(table_path(output, "attempts")) / "_delta_log"
    written = {p.name for p in log.iterdir() if p.is_file()}
    assert {"00000000000000000000.json", "00000000000000000001.json"} <= written
    assert {"00000000000000000000.crc", "00000000000000000001.crc"} <= written
    assert not {name for name in written if name.endswith(".json.crc")}, written
