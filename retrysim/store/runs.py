"""The runs under an output folder, managed: list, show, delete, vacuum and optimize
(``retrysim runs``).

Listing reads with delta-rs on the driver, no Spark. Delete, vacuum and optimize commit
through delta-spark when given a session (where delta-spark is the sink), else with
delta-rs; the tables are the same either way. A run is deleted
as it is published, in reverse: under the run's writer lease (so nobody publishes it
meanwhile), its ``runs`` row goes first, in one commit, and readers, which show only
complete runs, stop seeing all of it at that moment; its other tables' partitions follow.
A deleter that dies in between leaves partitions of a run that is neither complete nor
leased, which the next run's recovery removes (:func:`retrysim.store.recovery.recover`).
Several runs (a plan's) are deleted the same way together, one commit a table for all.

Vacuum removes the files no table version within the retention needs: the files of deleted
and replaced runs, which a plain Parquet reader of the folders would still count. As Delta's
own ``VACUUM``, it refuses a retention shorter than the tables' (``delta.
deletedFileRetentionDuration``, 7 days by default) unless forced: a reader of an older
version, or a writer that took its snapshot before, would lose its files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from retrysim.scenario.errors import ScenarioError
from retrysim.store.lease import acquire_lease, live_run_ids
from retrysim.store.recovery import remove_runs
from retrysim.store.sinks import (
    STATUS_COMPLETE,
    complete_run_ids,
    current_files,
    run_filter,
    table_path,
    table_rows,
    with_commit_retries,
)
from retrysim.tables.schemas import ALL_SCHEMAS, PARTITION_COLUMN, RUNS, TABLE_ORDER

DEFAULT_RETENTION_HOURS = 168  # Delta's own default for delta.deletedFileRetentionDuration
# Optimize can Z-order the tables keyed by message on these, so a message's rows (``msg_id =
# 42``, a group's) sit in few files for Delta's file statistics to skip to. Off by default:
# compaction leaves one file a run and table, and Z-order made no filter faster than
# compaction alone while taking longer itself (docs/performance.md).
ZORDER_COLUMNS = ("group", "msg_id")
STATUS_WRITING = "writing"  # a run under a live writer's lease, not yet published

Say = Callable[[str], None]


@dataclass(frozen=True)
class RunInfo:
    """One run as ``retrysim runs list`` shows it. ``status``: complete, publishing (its
    writer is publishing it, or died doing so), or writing (leased, nothing published)."""

    run_id: str
    status: str
    scenario: str | None = None
    started_at: object = None
    finished_at: object = None
    tables: str | None = None
    groups: int = 0
    messages: int = 0
    deliveries: int = 0
    dlq: int = 0
    files: int = 0
    bytes: int = 0
    start_at: object = None  # the scenario's real moment for time 0 (docs/scenario.md)
    point: int | None = None  # the run's plan point (null outside a plan)


def run_rows_by_id(output: str) -> dict[str, dict]:
    """Each run's ``runs`` row, every column of the schema (null where an older version
    wrote none): its complete row over its publishing one."""
    newest: dict[str, dict] = {}
    for row in table_rows(output, "runs"):
        known = newest.get(row[PARTITION_COLUMN])
        if known is None or known["status"] != STATUS_COMPLETE:
            newest[row[PARTITION_COLUMN]] = {name: row.get(name) for name in RUNS.fieldNames()}
    return newest


def list_runs(output: str, scenario: str | None = None, status: str | None = None) -> list[RunInfo]:
    """Every run under ``output``: its ``runs`` row, its groups' sizes from ``summary`` and
    its files in every table, and the runs being written (leased) that have no row yet;
    only those of ``scenario`` (its name) and ``status`` when given."""
    newest = run_rows_by_id(output)
    sizes = _summary_sizes(output)
    files = _files(output)
    seen, runs = set(), []
    for row in sorted(newest.values(), key=lambda row: (str(row["started_at"]), row["run_id"])):
        run_id = row[PARTITION_COLUMN]
        seen.add(run_id)
        groups, messages, deliveries, dlq = sizes.get(run_id, (0, 0, 0, 0))
        count, size = files.get(run_id, (0, 0))
        info = RunInfo(run_id, row["status"], row["scenario"], row["started_at"],
                       row["finished_at"], row["tables"], groups, messages, deliveries, dlq,
                       count, size, row["start_at"], row["point"])  # fmt: skip
        runs.append(info)
    for run_id in sorted(live_run_ids(output) - seen):
        runs.append(RunInfo(run_id, STATUS_WRITING, files=files.get(run_id, (0, 0))[0]))
    return [
        run
        for run in runs
        if (scenario is None or run.scenario == scenario)
        and (status is None or run.status == status)
    ]


def find_run(output: str, run_id: str) -> RunInfo:
    for run in list_runs(output):
        if run.run_id == run_id:
            return run
    raise ScenarioError(
        "--run-id", f"no run {run_id!r} in {output} (retrysim runs list shows them)"
    )


def delete_run(
    output: str, run_id: str, say: Say = lambda _line: None, spark: SparkSession | None = None
) -> list[str]:
    """Delete ``run_id`` from every table, its ``runs`` row first (readers stop seeing the
    run at that commit); returns the tables it was removed from. Refused while a writer
    holds the run's lease. With ``spark``, through delta-spark's ``DELETE``."""
    find_run(output, run_id)
    return delete_runs(output, [run_id], say, spark)


def delete_runs(
    output: str, run_ids: list[str], say: Say = lambda _line: None,
    spark: SparkSession | None = None, first: Callable[[], list[str]] | None = None,
) -> list[str]:  # fmt: skip
    """Delete ``run_ids`` together, one commit a table: under a lease on each (refused while
    a live writer holds one), ``first`` (what goes before them, e.g. a plan's rows), then
    their ``runs`` rows (readers stop seeing them all at that commit), then the other
    tables' partitions. Returns the tables they were removed from."""
    leases = []
    try:
        for run_id in run_ids:  # refuses a live writer of any of them
            leases.append(acquire_lease(output, run_id))
        removed = first() if first is not None else []
        if not run_ids:
            return removed
        removed += remove_runs(output, run_ids, ("runs",), spark)
        if len(run_ids) == 1:
            say(f"run {run_ids[0]}: its runs row is gone; readers no longer see it")
        else:
            say(f"{len(run_ids)} runs: their runs rows are gone; readers no longer see them")
        others = [t for t in TABLE_ORDER if t != "runs"]
        return removed + remove_runs(output, run_ids, others, spark)
    finally:
        for lease in leases:
            lease.release()


def vacuum(
    output: str, retention_hours: int = DEFAULT_RETENTION_HOURS, dry_run: bool = False,
    force: bool = False, spark: SparkSession | None = None,
) -> dict[str, list[str]]:  # fmt: skip
    """Remove (or with ``dry_run`` list) each table's files that no version within
    ``retention_hours`` needs; a retention under the tables' own is refused unless
    ``force``. Returns the files per table. With ``spark``, Delta's own ``VACUUM``."""
    found: dict[str, list[str]] = {}
    for table in TABLE_ORDER:
        path = table_path(output, table)
        if not DeltaTable.is_deltatable(path):
            continue
        try:
            if spark is not None:
                found[table] = _spark_vacuum(spark, path, retention_hours, dry_run, force)
            else:
                found[table] = DeltaTable(path).vacuum(
                    retention_hours=retention_hours,
                    dry_run=dry_run,
                    enforce_retention_duration=not force,
                )
        except Exception as error:  # the retention check (delta-rs' or Delta's): one line
            if "retention" not in str(error).lower():
                raise
            raise ScenarioError(
                "--retention",
                f"value {retention_hours}h is shorter than the tables' retention (delta."
                "deletedFileRetentionDuration); a reader of an older version, or a writer "
                "that took its snapshot before, would lose its files: add --force if none "
                "can be running",
            ) from None
    return found


def _spark_vacuum(
    spark: SparkSession, path: str, hours: int, dry_run: bool, force: bool
) -> list[str]:
    """Delta's ``VACUUM`` (its ``DRY RUN`` for ``dry_run``). The files it removes are listed
    by delta-rs' dry run beforehand, the same rule: a dry run of Delta's own is a second
    pass of Spark jobs over the table's files for a count."""
    check = "spark.databricks.delta.retentionDurationCheck.enabled"
    # Delta lists the table's files in a job of this many tasks (Spark's default: 10,000,
    # whose task overhead dwarfs the listing on a small machine); a core's worth does it
    listing = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
    spark.conf.set(check, str(not force).lower())
    spark.conf.set(listing, str(max(2, spark.sparkContext.defaultParallelism)))
    try:
        command = f"VACUUM delta.`{path}` RETAIN {hours} HOURS"
        if dry_run:
            return [row[0] for row in spark.sql(f"{command} DRY RUN").collect()]
        files = [  # the log's expired tombstones whose files are still there
            file
            for file in DeltaTable(path).vacuum(
                retention_hours=hours, dry_run=True, enforce_retention_duration=not force
            )
            if os.path.exists(os.path.join(path, file))
        ]
        if files:
            spark.sql(command).collect()
        return files
    finally:
        spark.conf.unset(check)
        spark.conf.unset(listing)


def optimize(
    output: str, run_ids: list[str] | None = None, zorder: bool = False,
    spark: SparkSession | None = None,
) -> dict[str, tuple[int, int]]:  # fmt: skip
    """Compact each table's files within the partitions of ``run_ids`` (default: every
    complete run), and with ``zorder`` Z-order the tables keyed by message by
    :data:`ZORDER_COLUMNS`. Returns (files removed, files added) per table. The rows do not
    change, only their files: a new version whose commit changes no data, so readers, time
    travel to earlier versions (until a vacuum) and the runs' ``published_versions`` stay
    as they were. With ``spark``, Delta's ``OPTIMIZE``, else delta-rs' optimize."""
    wanted = complete_run_ids(output) if run_ids is None else sorted(run_ids)
    done: dict[str, tuple[int, int]] = {}
    if not wanted:
        return done
    for table in TABLE_ORDER:
        path = table_path(output, table)
        if not DeltaTable.is_deltatable(path):
            continue
        keyed = zorder and all(c in ALL_SCHEMAS[table].fieldNames() for c in ZORDER_COLUMNS)

        def attempt(path: str = path, keyed: bool = keyed) -> tuple[int, int]:
            if spark is not None:
                order = ", ".join(f"`{column}`" for column in ZORDER_COLUMNS)
                command = f"OPTIMIZE delta.`{path}` WHERE {run_filter(wanted)}"
                metrics = spark.sql(f"{command} ZORDER BY ({order})" if keyed else command)
                row = metrics.first()["metrics"]
                return int(row["numFilesRemoved"]), int(row["numFilesAdded"])
            table_now = DeltaTable(path)
            filters = [(PARTITION_COLUMN, "in", wanted)]
            if keyed:
                result = table_now.optimize.z_order(list(ZORDER_COLUMNS), partition_filters=filters)
            else:
                result = table_now.optimize.compact(partition_filters=filters)
            return int(result["numFilesRemoved"]), int(result["numFilesAdded"])

        with_commit_retries(lambda table=table, attempt=attempt: done.update({table: attempt()}))
    return done


def _summary_sizes(output: str) -> dict[str, tuple[int, int, int, int]]:
    """Per run: groups, messages, deliveries and DLQ moves, summed over its groups."""
    sizes: dict[str, tuple[int, int, int, int]] = {}
    for row in table_rows(output, "summary", ["messages", "deliveries", "dlq"]):
        groups, messages, deliveries, dlq = sizes.get(row[PARTITION_COLUMN], (0, 0, 0, 0))
        sizes[row[PARTITION_COLUMN]] = (
            groups + 1, messages + (row["messages"] or 0), deliveries + (row["deliveries"] or 0),
            dlq + (row["dlq"] or 0),
        )  # fmt: skip
    return sizes


def _files(output: str) -> dict[str, tuple[int, int]]:
    """Per run: the files of its partitions in every table's current version, and their
    bytes."""
    found: dict[str, tuple[int, int]] = {}
    for table in TABLE_ORDER:
        path = table_path(output, table)
        if not DeltaTable.is_deltatable(path):
            continue
        for _, run_id, size in current_files(path):
            count, total = found.get(run_id, (0, 0))
            found[run_id] = (count + 1, total + int(size))
    return found
