"""Delta output: two interchangeable sinks behind one interface, and one reader.

A run first stages every table as Parquet (nothing visible yet); publishing then replaces
the run's partition of each table in a single Delta commit per table, ``runs`` last. Every
commit carries the run ids it published in its ``userMetadata`` (:func:`commit_note`), so
``DESCRIBE HISTORY`` says which runs each version holds.

* :class:`DeltaSparkSink` — moves the staged files into the run's partition as delta-rs
  does and commits the same add actions through Delta Lake's own transaction in the
  driver's JVM, when the Delta classes load: the default, with the JARs
  ``scripts/delta-jars.sh`` fetched (or a cluster started with ``--packages
  io.delta:delta-spark_2.13:...``).
* :class:`DeltaRsSink` — moves the staged Parquet files into ``<table>/run_id=<id>/`` and
  commits them with the ``deltalake`` package (add actions with statistics read from the
  Parquet footers; an overwrite filtered on ``run_id`` removes the run's previous files).
  Where the JARs are not there (``--delta-sink delta-rs``, or nothing could be fetched).
  Needs a local or mounted path (every executor writes there).

Both write the same tables at the same protocol (reader 1, writer 2: no deletion vectors,
no column mapping), which delta-rs, DuckDB and Polars read, and either continues a folder the
other began. Readers go through :func:`read_table`: Delta through Spark where it can, else
Parquet over the table's *active* files as the Delta log lists them. Never the folder as
plain Parquet: files an overwrite removed stay on disk until vacuum. The reader shows only
rows of runs whose ``runs`` row says ``complete`` (see :mod:`retrysim.store.recovery` for
the publish protocol).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, create_table_with_add_actions
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from retrysim.tables.schemas import ALL_SCHEMAS, PARTITION_COLUMN, SCHEMAS, data_schema

if TYPE_CHECKING:  # the compiled loop's workers import this and never load pandas
    import pandas as pd

_ARROW_TYPES = {
    T.StringType: pa.string(),
    T.LongType: pa.int64(),
    T.IntegerType: pa.int32(),
    T.DoubleType: pa.float64(),
    T.BooleanType: pa.bool_(),
    T.TimestampType: pa.timestamp("us", tz="UTC"),
}
# A run's status in ``runs``: readers show only complete runs; ``publishing`` hides a run
# while its tables are being replaced (retrysim.store.recovery).
STATUS_COMPLETE, STATUS_PUBLISHING = "complete", "publishing"
# Concurrent writers: a commit that lost a race (a newer table version, the table created
# by another writer in between) is retried with exponential backoff and jitter.
COMMIT_RETRIES = 12
COMMIT_BACKOFF_S, COMMIT_BACKOFF_MAX_S = 0.1, 3.0
# delta-rs' conflicts, and Delta Lake's (ConcurrentAppendException, ProtocolChangedException,
# MetadataChangedException, ... : another writer committed what this one read).
_RACE_SIGNS = (
    "onflict", "already exists", "not allowed for create", "changed since last",
    "ConcurrentAppend", "ConcurrentDelete", "ConcurrentTransaction", "ProtocolChanged",
    "MetadataChanged", "DELTA_CONCURRENT", "DELTA_PROTOCOL_CHANGED", "DELTA_METADATA_CHANGED",
)  # fmt: skip
# What each commit of a run did, in its userMetadata: the runs row as publishing, a data
# table's rows, the runs row as complete, a removal (recovery, rollback, runs delete).
STEPS = ("publishing", "publish", "complete", "remove")


# Every table's protocol stays at reader 1 / writer 2, which delta-rs, DuckDB and Polars read
# and write: no deletion vectors (a delete of a run's partition removes its files), no column
# mapping (the Parquet files' column names are the table's). Set when a sink creates a table;
# a Delta Lake session also makes them its defaults (retrysim.session.DELTA_CONF).
TABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "false",
    "delta.columnMapping.mode": "none",
    "delta.minReaderVersion": "1",
    "delta.minWriterVersion": "2",
}


def _arrow_type(dtype: T.DataType) -> pa.DataType:
    if isinstance(dtype, T.ArrayType):
        return pa.list_(pa.field("element", _arrow_type(dtype.elementType), nullable=True))
    return _ARROW_TYPES[type(dtype)]


def arrow_schema(schema: T.StructType) -> pa.Schema:
    """``schema`` as Arrow, each column's comment in its field metadata: delta-rs stores it
    as the Delta column's comment, which ``DESCRIBE TABLE`` shows."""
    return pa.schema(
        [
            pa.field(
                f.name,
                _arrow_type(f.dataType),
                nullable=True,
                metadata={b"comment": f.metadata["comment"].encode()}
                if f.metadata.get("comment")
                else None,
            )
            for f in schema.fields
        ]
    )


def table_path(output: str, table: str) -> str:
    """Absolute: the JVM resolves a relative path against its own working directory, which
    is not Python's once a notebook or test changes directory."""
    return os.path.join(os.path.abspath(output), table)


def delta_classes_available(spark: SparkSession) -> bool:
    """True when the JVM can load Delta Lake (delta-spark JARs on the classpath)."""
    try:
        loader = spark._jvm.java.lang.Thread.currentThread().getContextClassLoader()
        spark._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable", False, loader)
        return True
    except Exception:
        return False


def commit_note(step: str, run_ids: list[str]) -> str:
    """A commit's userMetadata: what it did to which runs, as JSON
    (``{"step": "publish", "run_ids": [...]}``), read back by :func:`published_versions`."""
    assert step in STEPS, step
    return json.dumps({"step": step, "run_ids": sorted(run_ids)}, separators=(",", ":"))


def published_versions(output: str, table: str, run_id: str) -> list[int]:
    """The versions of ``table`` whose commit published ``run_id`` (its rows, or for
    ``runs`` its complete row), oldest first: what ``VERSION AS OF`` takes to read the run as
    it was published (docs/cluster.md, "Time travel")."""
    path = table_path(output, table)
    if not DeltaTable.is_deltatable(path):
        return []
    found = []
    for commit in DeltaTable(path).history():
        try:
            note = json.loads(commit.get("userMetadata") or "")
        except (TypeError, ValueError):
            continue
        if note.get("step") in ("publish", "complete") and run_id in note.get("run_ids", []):
            found.append(int(commit["version"]))
    return sorted(found)


class Sink(Protocol):
    name: str

    def publish_runs(
        self, spark: SparkSession, output: str, table: str, staged: dict[str, str],
        step: str = "publish",
    ) -> None:  # fmt: skip
        """Replace the rows of ``table`` of each run (run id -> its staged Parquet folder)
        with its staged files, all in one commit, noted as ``step`` (:func:`commit_note`)."""

    def publish(self, spark: SparkSession, output: str, table: str, staged: str, run_id: str):
        """Replace the run's rows of ``table`` with the staged Parquet files, atomically."""

    def prepare(self, spark: SparkSession) -> None:
        """Ready the commit path while the run simulates (called on a thread of its own);
        never fails."""


class _OneRun:
    """``publish``: ``publish_runs`` of one run; nothing to prepare."""

    def prepare(self, spark: SparkSession) -> None:
        return None

    def publish(
        self, spark: SparkSession, output: str, table: str, staged: str, run_id: str
    ) -> None:
        self.publish_runs(spark, output, table, {run_id: staged})


def move_staged(output: str, table: str, staged: dict[str, str]) -> list[AddAction]:
    """Move each run's staged Parquet files into its partition of ``table`` (invisible until
    a commit adds them), returning their add actions."""
    root = Path(table_path(output, table))
    actions = []
    # a name of its own for every file published: a staged name (part-00000.parquet of a
    # runs row, of a table pyarrow wrote) recurs, and a file moved onto a path that an
    # earlier version lists would change under its readers (the runs table's publishing
    # row, replaced in place by the complete row, read as a broken file by a concurrent
    # run's reader of the earlier version)
    token = uuid.uuid4().hex[:16]
    for run_id, folder in staged.items():
        partition = root / f"{PARTITION_COLUMN}={run_id}"
        partition.mkdir(parents=True, exist_ok=True)
        for source in sorted(Path(folder).glob("*.parquet")):
            target = partition / f"{token}-{source.name}"
            os.replace(source, target)
            actions.append(_add_action(target, root, run_id))
    return actions


class DeltaRsSink(_OneRun):
    name = "delta-rs"

    def publish_runs(
        self, spark: SparkSession, output: str, table: str, staged: dict[str, str],
        step: str = "publish",
    ) -> None:  # fmt: skip
        actions = move_staged(output, table, staged)
        schema = arrow_schema(ALL_SCHEMAS[table])
        note = commit_note(step, list(staged))
        path = table_path(output, table)
        with_commit_retries(lambda: _commit(path, schema, actions, sorted(staged), note))


def lost_commit_race(error: Exception) -> bool:
    """A commit another writer got in first: a conflict, or two writers creating version 0."""
    return isinstance(error, CommitFailedError) or any(s in str(error) for s in _RACE_SIGNS)


def with_commit_retries(commit) -> None:
    """Run ``commit`` (which re-reads the table each time), retrying lost commit races."""
    for attempt in range(COMMIT_RETRIES):
        try:
            commit()
            return
        except Exception as error:
            if attempt == COMMIT_RETRIES - 1 or not lost_commit_race(error):
                raise
            pause = min(COMMIT_BACKOFF_MAX_S, COMMIT_BACKOFF_S * 2**attempt)
            time.sleep(pause * random.uniform(0.5, 1.0))


def noted(note: str) -> CommitProperties:
    """delta-rs' commit properties carrying ``note`` as the commit's userMetadata."""
    return CommitProperties(custom_metadata={"userMetadata": note})


def _commit(
    uri: str, schema: pa.Schema, actions: list[AddAction], run_ids: list[str], note: str
) -> None:
    if DeltaTable.is_deltatable(uri):
        DeltaTable(uri).create_write_transaction(
            actions,
            mode="overwrite",
            schema=schema,
            partition_by=[PARTITION_COLUMN],
            partition_filters=[(PARTITION_COLUMN, "in", run_ids)],
            commit_properties=noted(note),
        )
    else:
        create_table_with_add_actions(
            uri, DeltaSchema.from_arrow(schema), actions, mode="append",
            partition_by=[PARTITION_COLUMN], configuration=TABLE_PROPERTIES,
            commit_properties=noted(note),
        )  # fmt: skip


def _add_action(path: Path, root: Path, run_id: str) -> AddAction:
    """An add action with Delta statistics from the file's Parquet footer (no data read)."""
    metadata = pq.ParquetFile(path).metadata
    stats: dict[str, object] = {"numRecords": metadata.num_rows}
    mins: dict[str, object] = {}
    maxs: dict[str, object] = {}
    nulls: dict[str, int] = {}
    for column in range(metadata.num_columns):
        name = metadata.schema.column(column).name
        nulls[name] = 0
        for group in range(metadata.num_row_groups):
            column_stats = metadata.row_group(group).column(column).statistics
            if column_stats is None or not column_stats.has_null_count:
                nulls.pop(name, None)
                break
            nulls[name] += column_stats.null_count
            if column_stats.has_min_max and isinstance(column_stats.min, (int, float, str)):
                low, high = column_stats.min, column_stats.max
                mins[name] = low if name not in mins else min(mins[name], low)
                maxs[name] = high if name not in maxs else max(maxs[name], high)
    stats.update(minValues=mins, maxValues=maxs, nullCount=nulls)
    info = path.stat()
    return AddAction(
        path=str(path.relative_to(root)),
        size=info.st_size,
        partition_values={PARTITION_COLUMN: run_id},
        modification_time=int(info.st_mtime * 1000),
        data_change=True,
        stats=json.dumps(stats),
    )


class DeltaSparkSink(_OneRun):
    """Delta Lake's own transaction (``DeltaLog.startTransaction``) commits the staged files
    where they are, as delta-rs does: the same moved files and add actions, the run's older
    files removed, in one optimistic commit with Delta's conflict checks (a concurrent
    writer of the same partitions conflicts; of other runs, not). Writing the rows again
    through ``df.write`` would read and re-encode every row for nothing, and run Spark jobs
    for every table even for a row (docs/performance.md)."""

    name = "delta-spark"

    def publish_runs(
        self, spark: SparkSession, output: str, table: str, staged: dict[str, str],
        step: str = "publish",
    ) -> None:  # fmt: skip
        adds = move_staged(output, table, staged)
        path = table_path(output, table)
        note = commit_note(step, list(staged))
        with_commit_retries(lambda: _DeltaJvm(spark).commit(path, table, adds, list(staged), note))

    def prepare(self, spark: SparkSession) -> None:
        """A driver JVM's first Delta commits load and compile Delta's commit path: CPU
        spent at a run's end, on the critical path. One throwaway commit of a row into a
        scratch table, while the run simulates (its stage often leaves a core idle), pays it
        beforehand; once per JVM."""
        if getattr(spark.sparkContext, "_retrysim_delta_ready", False):
            return
        spark.sparkContext._retrysim_delta_ready = True
        scratch = tempfile.mkdtemp(prefix="retrysim-delta-")
        try:
            staged = os.path.join(scratch, "staged")
            os.mkdir(staged)
            schema = arrow_schema(data_schema(ALL_SCHEMAS["runs"]))
            pq.write_table(schema.empty_table(), os.path.join(staged, "part-0.parquet"))
            self.publish_runs(spark, scratch, "runs", {"warm-up": staged})
            self.publish_runs(spark, scratch, "runs", {"warm-up": staged}, step="complete")
        except Exception:  # a cold commit path is slower, not wrong
            pass
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


class _DeltaJvm:
    """Delta Lake's commit API through the driver's JVM (py4j): Scala collections and
    options built from Python values, actions from their JSON form in the Delta log."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.jvm = spark._jvm
        self.convert = self.jvm.scala.jdk.javaapi.CollectionConverters

    def seq(self, items: list):
        values = self.jvm.java.util.ArrayList()
        for item in items:
            values.add(item)
        return self.convert.asScala(values).toList()

    def module(self, name: str):
        """A Scala object (``name$.MODULE$``)."""
        holder = self.jvm
        for part in name.split("."):
            holder = getattr(holder, part)
        return getattr(holder, "MODULE$")  # py4j reads the static field

    def action(self, action: dict):
        return self.module("org.apache.spark.sql.delta.actions.Action$").fromJson(
            json.dumps(action)
        )

    def some(self, value):
        return self.jvm.scala.Some(value)

    def commit(
        self, path: str, table: str, adds: list[AddAction], run_ids: list[str], note: str
    ) -> None:
        jvm = self.jvm
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.spark._jsparkSession, path)
        txn = log.startTransaction()
        if txn.readVersion() < 0:
            txn.updateMetadataForNewTable(self.action({"metaData": _new_metadata(table)}))
        removes = _remove_json(path, txn.readVersion(), run_ids)
        actions = [self.action(action) for action in removes]
        actions += [self.action({"add": _add_json(add)}) for add in adds]
        none = self.module("scala.None$")
        operation = jvm.org.apache.spark.sql.delta.DeltaOperations.Write(
            jvm.org.apache.spark.sql.SaveMode.Overwrite,
            self.some(self.seq([PARTITION_COLUMN])),
            self.some(run_filter(run_ids)),
            self.some(note),
            none, none, none,
        )  # fmt: skip
        txn.commit(self.seq(actions), operation)


def _new_metadata(table: str) -> dict:
    """A new table's metadata action: its schema (with the columns' comments), partitioned
    by run_id, at the pinned protocol."""
    return {
        "id": str(uuid.uuid4()),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": ALL_SCHEMAS[table].json(),
        "partitionColumns": [PARTITION_COLUMN],
        "configuration": TABLE_PROPERTIES,
        "createdTime": int(time.time() * 1000),
    }


def _remove_json(path: str, version: int, run_ids: list[str]) -> list[dict]:
    """Remove actions for the files of ``run_ids`` in ``version`` of the table: the version
    the transaction read, listed by delta-rs from the same log (Delta's own listing of a
    partition's files is a Spark job over the whole log, for every table). A writer that
    removed one of them first makes the commit conflict, and it is retried."""
    if version < 0:
        return []
    files = pa.table(DeltaTable(path, version=version).get_add_actions(flatten=True))
    now = int(time.time() * 1000)
    wanted = set(run_ids)
    return [
        {"remove": {"path": file, "deletionTimestamp": now, "dataChange": True,
                    "extendedFileMetadata": True, "partitionValues": {PARTITION_COLUMN: run},
                    "size": size}}
        for file, run, size in zip(
            files.column("path").to_pylist(),
            files.column(f"partition.{PARTITION_COLUMN}").to_pylist(),
            files.column("size_bytes").to_pylist(),
            strict=True,
        )
        if run in wanted
    ]  # fmt: skip


def _add_json(add: AddAction) -> dict:
    """An add action as the Delta log writes it (delta-rs' AddAction, the same fields)."""
    return {
        "path": add.path,
        "partitionValues": dict(add.partition_values),
        "size": add.size,
        "modificationTime": add.modification_time,
        "dataChange": add.data_change,
        "stats": add.stats,
    }


def delete_runs_with_spark(spark: SparkSession, path: str, run_ids: list[str]) -> None:
    """One Delta ``DELETE`` of ``run_ids``' rows from the table at ``path`` (whole partitions:
    Delta removes their files, no deletion vectors), noted as a removal. The caller retries
    a lost commit race (:func:`with_commit_retries`)."""
    key = "spark.databricks.delta.commitInfo.userMetadata"
    spark.conf.set(key, commit_note("remove", run_ids))
    try:
        spark.sql(f"DELETE FROM delta.`{path}` WHERE {run_filter(run_ids)}").collect()
    finally:
        spark.conf.unset(key)


def run_filter(run_ids: list[str]) -> str:
    """SQL for the rows of ``run_ids`` (ids match RUN_ID_PATTERN: no quotes inside)."""
    return f"{PARTITION_COLUMN} IN ({', '.join(repr(str(r)) for r in sorted(run_ids))})"


def choose_sink(spark: SparkSession, preference: str = "auto") -> Sink:
    """``auto`` picks delta-spark when its classes load, else the delta-rs commit path."""
    if preference == "delta-rs":
        return DeltaRsSink()
    available = delta_classes_available(spark)
    if preference == "delta-spark" and not available:
        raise RuntimeError(
            "--delta-sink delta-spark: the Delta Lake classes are not on the JVM classpath "
            "(start Spark with --packages io.delta:delta-spark_2.13:<version> or its JARs)"
        )
    return DeltaSparkSink() if available else DeltaRsSink()


def complete_run_ids(output: str) -> list[str]:
    """Run ids whose ``runs`` row says complete (the runs table is one small row per run)."""
    rows = table_rows(output, "runs", ["status"])
    return sorted({row[PARTITION_COLUMN] for row in rows if row["status"] == STATUS_COMPLETE})


def current_files(path: str) -> list[tuple[str, str, int]]:
    """The files of a Delta table's current version: (path within it, run id, bytes)."""
    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    return list(
        zip(
            actions.column("path").to_pylist(),
            actions.column(f"partition.{PARTITION_COLUMN}").to_pylist(),
            actions.column("size_bytes").to_pylist(),
            strict=True,
        )
    )


def table_rows(output: str, table: str, columns: list[str] | None = None) -> list[dict]:
    """A small table's rows with their run ids, from its current version's files, read with
    pyarrow: delta-rs' own dataset reader made a process without Spark abort at exit, at
    random ("terminate called without an active exception")."""
    path = table_path(output, table)
    if not DeltaTable.is_deltatable(path):
        return []
    rows = []
    for file, run_id, _ in current_files(path):
        for row in pq.read_table(os.path.join(path, file), columns=columns).to_pylist():
            rows.append({**row, PARTITION_COLUMN: run_id})
    return rows


def complete_files(output: str, table: str) -> list[str]:
    """The files of ``table`` that hold complete runs, in its current version: what a reader
    outside Spark (DuckDB, Polars, pyarrow) scans, with hive partitioning for ``run_id``,
    to see exactly what :func:`read_table` shows (docs/cluster.md, "Reading the tables").
    The Delta log lists the files, so a replaced run's older files, still on disk until a
    vacuum, are not among them; the runs table lists the complete runs, so a run being
    published, or left half-published by a writer that died, is not either."""
    if not DeltaTable.is_deltatable(table_path(output, table)):
        return []
    return [uri.removeprefix("file://") for uri in _file_uris(output, table)]


def _file_uris(output: str, table: str, complete_only: bool = True) -> list[str]:
    """The files of an existing table's current version, of its complete runs only unless
    ``complete_only`` is False. The snapshot is taken before the list of complete runs is
    read, so a run being re-published is never shown half replaced."""
    snapshot = DeltaTable(table_path(output, table))
    if not (complete_only and table in SCHEMAS):
        return snapshot.file_uris()
    runs = complete_run_ids(output)
    return snapshot.file_uris(partition_filters=[(PARTITION_COLUMN, "in", runs)]) if runs else []


def read_table(
    spark: SparkSession, output: str, table: str, complete_only: bool = True
) -> DataFrame:
    """A table as a Spark DataFrame, every complete run; filter on ``run_id`` for one run.

    Rows of runs that are not complete (being published, or left by a writer that died) are
    hidden unless ``complete_only=False`` (:func:`_file_uris` says how)."""
    schema = ALL_SCHEMAS[table]
    path = table_path(output, table)
    if not DeltaTable.is_deltatable(path):
        return spark.createDataFrame([], schema)
    if delta_classes_available(spark):
        stored = spark.read.format("delta").load(path)
        df = stored.select(
            *(
                F.col(field.name)
                if field.name in stored.columns
                else F.lit(None).cast(field.dataType).alias(field.name)  # a column added later
                for field in schema.fields
            )
        )
        hide = complete_only and table in SCHEMAS
        return df.where(F.col(PARTITION_COLUMN).isin(complete_run_ids(output))) if hide else df
    files = _file_uris(output, table, complete_only)
    if not files:
        return spark.createDataFrame([], schema)
    return (
        spark.read.schema(schema)
        .option("basePath", path)
        .parquet(*files)
        .select(*schema.fieldNames())
    )


def run_rows(output: str, table: str, run_id: str) -> list[dict]:
    """One run's rows of a small table (runs, summary, load), read by delta-rs on the
    driver, whatever the run's status (the caller checks it): on a new JVM, a Spark job's
    planning and compiling would cost far more than reading a few rows. Only for tables
    whose rows fit in the driver."""
    return _run_arrow(output, table, run_id).to_pylist()


def run_frame(output: str, table: str, run_id: str) -> pd.DataFrame:
    """:func:`run_rows` as pandas (as Spark's ``toPandas`` gives them)."""
    return _run_arrow(output, table, run_id).to_pandas()


def _run_arrow(output: str, table: str, run_id: str) -> pa.Table:
    path = table_path(output, table)
    if not DeltaTable.is_deltatable(path):
        return arrow_schema(ALL_SCHEMAS[table]).empty_table()
    rows = DeltaTable(path).to_pyarrow_table(partitions=[(PARTITION_COLUMN, "=", run_id)])
    for field in arrow_schema(ALL_SCHEMAS[table]):
        if field.name not in rows.column_names:  # a nullable column a later version added
            rows = rows.append_column(field, pa.nulls(rows.num_rows, field.type))
    return rows.select(ALL_SCHEMAS[table].fieldNames())
