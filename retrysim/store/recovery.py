"""Atomic runs: publish-or-nothing, and recovery after a crash.

A run's eight tables are eight Delta commits, so a driver that dies between two of them
would leave rows of a run that never finished. :func:`publish_run` writes the ``runs`` row
as ``publishing`` first and ``complete`` last, and readers (:func:`read_table`) show only
complete runs. A writer holds a lease (:mod:`retrysim.store.lease`) from before it stages
anything until after its last commit, so :func:`recover`, at the start of every run and of
``retrysim validate``, can remove the partitions of runs that are neither complete nor
leased, and never a live run's (docs/architecture.md, "Atomic runs").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from retrysim.store.lease import Lease, clean_staging, live_run_ids
from retrysim.store.sinks import (
    Sink,
    arrow_schema,
    commit_note,
    complete_run_ids,
    delete_runs_with_spark,
    noted,
    table_path,
    with_commit_retries,
)
from retrysim.tables.schemas import ALL_SCHEMAS, PARTITION_COLUMN, TABLE_ORDER

Say = Callable[[str], None]

# --------------------------------------------------------------------------- recovery


@dataclass
class Recovery:
    """What :func:`recover` removed: run ids per table, and stale staging entries."""

    removed: dict[str, list[str]] = field(default_factory=dict)
    cleaned: list[str] = field(default_factory=list)

    @property
    def runs(self) -> list[str]:
        return sorted({run for runs in self.removed.values() for run in runs})


def drop_partitions(snapshot: DeltaTable, table: str, run_ids: list[str]) -> None:
    """One commit removing the snapshot's files of ``run_ids`` (an overwrite with no adds)."""
    snapshot.create_write_transaction(
        [],
        mode="overwrite",
        schema=arrow_schema(ALL_SCHEMAS[table]),
        partition_by=[PARTITION_COLUMN],
        partition_filters=[(PARTITION_COLUMN, "in", run_ids)],
        commit_properties=noted(commit_note("remove", run_ids)),
    )


def _present(snapshot: DeltaTable) -> set[str]:
    return {part[PARTITION_COLUMN] for part in snapshot.partitions()}


def recover(output: str, say: Say | None = None) -> Recovery:
    """Remove every trace of runs whose writer died before completing them.

    Data tables first, ``runs`` last (as a run publishes), then stale staging folders."""
    report = Recovery()
    for table in TABLE_ORDER:
        path = table_path(output, table)
        if not DeltaTable.is_deltatable(path):
            continue

        def attempt(table: str = table, path: str = path) -> None:
            snapshot = DeltaTable(path)  # 1. snapshot, 2. leases, 3. complete runs
            present = _present(snapshot)
            if not present:
                return
            doomed = sorted(present - live_run_ids(output) - set(complete_run_ids(output)))
            if doomed:
                drop_partitions(snapshot, table, doomed)
                report.removed[table] = doomed

        with_commit_retries(attempt)
    report.cleaned = clean_staging(output)
    if say and report.runs:
        tables = ", ".join(sorted(report.removed))
        say(f"recovery: removed incomplete run(s) {', '.join(report.runs)} from {tables}")
    if say and report.cleaned:
        say(f"recovery: removed {len(report.cleaned)} stale staging entries of dead writers")
    return report


def remove_runs(
    output: str, run_ids: list[str], tables: Sequence[str] = TABLE_ORDER,
    spark: SparkSession | None = None,
) -> list[str]:  # fmt: skip
    """Remove ``run_ids`` from ``tables`` (every run table), a commit each in that order (a
    failed publish rolls itself back; ``retrysim runs delete`` takes ``runs`` first);
    returns the tables they were in. With ``spark``, through delta-spark's ``DELETE``
    (``retrysim runs delete`` where delta-spark is the sink), else with delta-rs."""
    removed = []
    for table in tables:
        path = table_path(output, table)
        if not DeltaTable.is_deltatable(path):
            continue

        def attempt(table: str = table, path: str = path) -> None:
            snapshot = DeltaTable(path)
            doomed = sorted(_present(snapshot) & set(run_ids))
            if doomed and spark is not None:
                delete_runs_with_spark(spark, path, doomed)
            elif doomed:
                drop_partitions(snapshot, table, doomed)
            if doomed:
                removed.append(table)

        with_commit_retries(attempt)
    return removed


# --------------------------------------------------------------------------- publishing


def publish_run(
    sink: Sink,
    spark: SparkSession,
    output: str,
    staged: dict[str, str],
    marker: str,
    lease: Lease,
) -> None:
    """Publish a staged run: ``runs`` as publishing, the data tables, ``runs`` as complete.

    ``staged`` maps every table the run writes to its staged Parquet folder (``runs`` holds
    the complete row), ``marker`` is the staged ``runs`` row with status publishing. If
    anything fails after the marker is committed, the run's partitions are removed again
    (best effort; a later :func:`recover` finishes the job when this process cannot)."""
    publish_runs(sink, spark, output, [(staged, marker, lease)])


def publish_runs(
    sink: Sink,
    spark: SparkSession,
    output: str,
    runs: list[tuple[dict[str, str], str, Lease]],
) -> None:
    """:func:`publish_run` for several staged runs (staged tables, marker, lease) at once:
    each step one commit for all of them, so the runs appear together, and a failure after
    the markers removes them all again."""
    run_ids = [lease.run_id for _, _, lease in runs]
    for _, _, lease in runs:
        lease.check()
    markers = {lease.run_id: marker for _, marker, lease in runs}
    sink.publish_runs(spark, output, "runs", markers, step="publishing")
    try:
        data = {
            table: {lease.run_id: staged[table] for staged, _, lease in runs if table in staged}
            for table in TABLE_ORDER
            if table != "runs"
        }
        # the data tables' commits are independent (readers hide the runs until the last
        # commit), so they go side by side: a Delta Lake commit is mostly waiting on the log
        with ThreadPoolExecutor(max_workers=len(data)) as pool:
            commits = [
                pool.submit(sink.publish_runs, spark, output, table, mine)
                for table, mine in data.items()
                if mine  # a lean run stages fewer tables
            ]
        for commit in commits:  # all have ended; the first failure, if any, is raised
            commit.result()
        for _, _, lease in runs:
            lease.check()
        complete = {lease.run_id: staged["runs"] for staged, _, lease in runs}
        sink.publish_runs(spark, output, "runs", complete, step="complete")
    except BaseException:
        with contextlib.suppress(Exception):
            remove_runs(output, run_ids)
        raise
