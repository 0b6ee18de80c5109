"""The event stage: the sequential engine's Spark stage, one task per key, and its run.

Ordered queues (head-of-line blocking), a consumer pool that fills up (time in Ready emerges
from load) and batches cannot be computed a round at a time: whether a delivery starts
depends on other messages. Each key (one ordered queue when the pool can never be full, a
unit of a group, else a whole group) is a task of one ``mapInArrow`` stage: the task makes
the key's messages, runs them through the compiled loop
(:func:`~retrysim.engine.event_key.simulate_key`), writes its rows as files of the
attempts table and sums a whole group's rows up for staging as they leave
(:mod:`retrysim.tables.key_peaks`). :func:`run_events` runs the stage for the runs' groups
from the driver, says how far the keys got from their heartbeats, and feeds the retry
owners of groups run in units.
"""

from __future__ import annotations

import gc
import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.accumulators import Accumulator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import LongType, StringType, StructField, StructType

from retrysim.engine.event_key import (
    IMPORTED,
    GroupKey,
    Heartbeat,
    KeySpec,
    as_batch,
    pandas_nullable,
    read_heartbeats,
    simulate_key,
    units_of,
)
from retrysim.engine.rounds import GroupPlan, key_specs, next_frontier, union_all
from retrysim.model.workload import messages_np
from retrysim.progress import Progress
from retrysim.scenario.spec import Scenario
from retrysim.scenario.units import human_ms
from retrysim.session import full_jit, python_tasks
from retrysim.tables.commitlog_writes import pops_of
from retrysim.tables.group_sums import COUNTS, PEAK_HALVES, RATES, SHARES, GroupSums, GroupSumsParam
from retrysim.tables.key_peaks import GroupSummer
from retrysim.tables.message_tables import (
    TASK_TABLES_DIR,
    TaskTableWriter,
    messages_of,
    parquet_writer,
)
from retrysim.tables.schemas import SCHEMAS, STAGE, STAGE_ARROW, data_schema
from retrysim.tables.schemas import write_rows as write_small_rows

if TYPE_CHECKING:  # a worker of the compiled loop never loads pandas (a slow import)
    import pandas as pd

OUTPUT_CHUNK_ROWS = 100_000
ENGINE_SEQUENTIAL = "sequential"  # the engine column of its groups' summaries, its staging folder
# A group simulated a queue at a time (per lane) with more messages than this is scanned by
# staging in Spark: its JIT-compiled plans then pay for themselves (docs/performance.md).
LANES_SCANNED_MESSAGES = 5_000_000


def key_count(
    specs: list[KeySpec], per_lane: set[GroupKey], split: set[GroupKey] = frozenset()
) -> int:
    """How many keys :func:`sequential_attempts` simulates: a queue of each group in
    ``per_lane``, each unit but the retry owners' of each group in ``split``, else the
    group (the sets name groups by :attr:`KeySpec.key`)."""
    return len([task for task in _tasks(specs, per_lane, split, 1) if task.part == 0])


@dataclass(frozen=True)
class _Task:
    """One task of the event-by-event stage: a key (a queue of ``lane``, else the whole
    group's messages), the share ``part`` of ``parts`` of its rows it writes, and the unit
    it runs (the instances it runs, and those it sends retries to), if not the group."""

    spec: int
    lane: int | None
    part: int = 0
    parts: int = 1
    unit: tuple[tuple[int, ...], tuple[int, ...]] | None = None


def _tasks(
    specs: list[KeySpec], per_lane: set[GroupKey], split: set[GroupKey], parts: int
) -> list[_Task]:
    tasks = []
    for index, spec in enumerate(specs):
        if spec.key in per_lane:
            tasks += [_Task(index, lane) for lane in range(spec.queues)]
        elif spec.key in split:
            units = units_of(spec)
            tasks += [_Task(index, None, unit=(runs, units.retry_owners)) for runs in units.first]
        else:
            tasks += [_Task(index, None, part, parts) for part in range(parts)]
    return tasks


def sequential_attempts(
    spark: SparkSession,
    specs: list[KeySpec],
    per_lane: set[GroupKey],
    partitions: int,
    heartbeats: str | None = None,
    sums: Accumulator | None = None,
    split: set[GroupKey] = frozenset(),
) -> DataFrame:
    """Staged attempts of ``specs``' groups, one task per key: a queue of the groups in
    ``per_lane`` (ordered queues that never fill the pool), each unit but the retry
    owners' of the groups in ``split`` (:func:`units_of`; :func:`retry_owner_attempts`
    runs the retry owners next), else the whole group. Each key sends its
    :class:`Heartbeat` to the folder ``heartbeats``, if given, and each whole group its
    :class:`retrysim.tables.key_peaks.GroupSums` to the accumulator ``sums`` (of
    :class:`retrysim.tables.key_peaks.GroupSumsParam`, under its :attr:`KeySpec.key`), if
    given.

    The stage's input is the keys alone, spread evenly over ``partitions``: each task makes
    its keys' messages itself (:func:`retrysim.model.workload.messages_np`, the messages
    table's values bit for bit), one key at a time, so no message crosses the network and
    a task holds one key's messages at once. Rows go back as Arrow record batches
    (``mapInArrow``), which the compiled loop builds without pandas.

    Where whole groups are fewer than the cores, each is simulated by several tasks at once
    (:func:`output_parts`), each keeping its share of the batches (each batch goes to the
    part that has kept the fewest rows so far): the loop is cheap next to encoding its rows,
    and they are the same in every task, so all cores write (and the first two sum up the
    group's rows, a share each)."""
    tasks, positions = _stage_tasks(spark, specs, per_lane, partitions, split)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for position in batch.column(0).to_pylist():
                task = tasks[position]
                yield from _simulate_one(specs[task.spec], task, position, heartbeats, sums)

    return positions.mapInArrow(run, STAGE)


@dataclass(frozen=True)
class RunFolders:
    """Where the event-by-event stage writes one run's files: its attempts, and the
    :data:`retrysim.tables.message_tables.TASK_TABLES` ``tables`` its whole groups' tasks make
    (each under ``task_tables/<table>``)."""

    attempts: str
    task_tables: str | None = None
    tables: tuple[str, ...] = ()


def write_sequential_attempts(
    spark: SparkSession,
    specs: list[KeySpec],
    per_lane: set[GroupKey],
    partitions: int,
    folder: str,
    heartbeats: str | None = None,
    sums: Accumulator | None = None,
    split: set[GroupKey] = frozenset(),
    task_tables: tuple[str, tuple[str, ...]] | None = None,
) -> int:
    """:func:`write_runs_attempts` for one run: its rows in ``folder``, and with
    ``task_tables`` (a folder, table names) those tables."""
    tables_dir, tables = task_tables or (None, ())
    outputs = [RunFolders(folder, tables_dir, tables)]
    return write_runs_attempts(spark, specs, per_lane, partitions, outputs, heartbeats, sums, split)


def write_runs_attempts(
    spark: SparkSession,
    specs: list[KeySpec],
    per_lane: set[GroupKey],
    partitions: int,
    outputs: list[RunFolders],
    heartbeats: str | None = None,
    sums: Accumulator | None = None,
    split: set[GroupKey] = frozenset(),
) -> int:
    """:func:`sequential_attempts`' rows as Parquet files, each run's (``KeySpec.run``) in
    the folder ``outputs[run].attempts``, one per core and run (``part-<n>.parquet``, each
    task running its keys in turn), written by the tasks themselves; returns the row count.
    Several runs in one stage (a plan's points and replications) pay the stage's start once,
    and a cluster runs them side by side.

    Spark's writer takes the rows through Arrow into the JVM and encodes them again there,
    several times the simulation's own work. Here each task encodes
    its rows with pyarrow (STAGE_ARROW's types are the ones Spark writes and reads back)
    into a folder of its own attempt, and returns the files' names; the driver moves the
    files of the attempts Spark kept (one per task) into place and removes the rest, so a
    failed or speculative attempt leaves nothing behind, as with Spark's committer. The
    folders must be ones every executor and the driver see (as for Spark's writer).

    The tasks that simulate a whole group also write the run's ``tables``
    (:mod:`retrysim.tables.message_tables`) into ``<task_tables>/<table>`` the same way; each
    such folder is there afterwards, with at least one file."""
    tasks, positions = _stage_tasks(spark, specs, per_lane, partitions, split)
    attempts_dir = os.path.join(outputs[0].attempts, "_attempts")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        name = f"part-{context.partitionId():05d}.parquet"
        attempt = os.path.join(attempts_dir, str(context.taskAttemptId()))
        by_run: dict[int, list[int]] = {}
        for batch in batches:
            for position in batch.column(0).to_pylist():
                by_run.setdefault(specs[tasks[position].spec].run, []).append(position)
        written = []
        for index, positions in by_run.items():
            folder = os.path.join(attempt, str(index))
            found = _write_keys(specs, tasks, positions, folder, name, outputs[index].tables,
                                heartbeats, sums)  # fmt: skip
            written += [{"run": index, **row} for row in found]
        yield pa.RecordBatch.from_pylist(written, schema=_WRITTEN_ARROW)

    cores = spark.sparkContext.defaultParallelism
    try:
        with python_tasks(spark):
            written = positions.coalesce(cores).mapInArrow(run, _WRITTEN).collect()
        into = {
            (index, table): os.path.join(out.task_tables, table)
            for index, out in enumerate(outputs)
            for table in out.tables
        } | {(index, "attempts"): out.attempts for index, out in enumerate(outputs)}
        for target in into.values():
            os.makedirs(target, exist_ok=True)
        for row in written:
            target = into[row["run"], row["table"]]
            os.replace(row["path"], os.path.join(target, os.path.basename(row["path"])))
        for (_, table), target in into.items():
            if table != "attempts" and not os.listdir(target):  # no rows: a file with the columns
                write_small_rows([], data_schema(SCHEMAS[table]), target)
    finally:
        shutil.rmtree(attempts_dir, ignore_errors=True)
    return sum(row["rows"] for row in written if row["table"] == "attempts")


def _write_keys(
    specs: list[KeySpec],
    tasks: list[_Task],
    positions: list[int],
    folder: str,
    name: str,
    tables: tuple[str, ...],
    heartbeats: str | None,
    sums: Accumulator | None,
) -> list[dict]:
    """One task's keys of one run, simulated in turn: their rows as ``folder/name`` and the
    whole groups' ``tables`` as ``folder/<table>/name``; (table, path, rows) of each file."""
    derived = TaskTableWriter(folder, name, tables)

    def rows() -> Iterator[pa.RecordBatch]:
        for position in positions:
            task = tasks[position]
            spec = specs[task.spec]
            whole = task.lane is None and task.unit is None
            messages = messages_np(spec.workload, spec.group, spec.seed, task.lane)
            for chunk in _simulate_one(spec, task, position, heartbeats, sums, messages):
                if whole:
                    derived.add_attempts(chunk, spec.topic)
                yield chunk
            if whole and "messages" in tables:
                size = spec.workload.size_bytes
                made = messages_of(messages, spec.group, spec.topic, size, task.part, task.parts)
                derived.write("messages", made)

    path = os.path.join(folder, name)
    with no_cyclic_gc():
        count = write_rows(rows(), path)
    written = [{"table": "attempts", "path": path, "rows": count}] if count else []
    return written + [
        {"table": table, "path": path, "rows": count} for table, path, count in derived.close()
    ]


# what each task of write_sequential_attempts wrote
_WRITTEN = StructType(
    [StructField(name, kind) for name, kind in (("run", LongType()), ("table", StringType()),
                                                ("path", StringType()), ("rows", LongType()))]
)  # fmt: skip
_WRITTEN_ARROW = to_arrow_schema(_WRITTEN)
ROW_GROUP_ROWS = 500_000  # rows per Parquet row group (Spark's 128 MB blocks, about)


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Python's cyclic collector off for a task's loop: the loop's arrays and batches make
    no cycles, and the collections their allocations set off cost a task at 3M messages
    about 4 % of its time (perf); reference counting still frees everything at once."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def write_rows(batches: Iterator[pa.RecordBatch], path: str) -> int:
    """Write ``batches`` (STAGE_ARROW) as one Parquet file at ``path``, in row groups of
    about ROW_GROUP_ROWS, as Spark's writer would (snappy); no rows, no file. Returns the
    row count."""
    writer, pending, held, count = None, [], 0, 0
    try:
        for batch in batches:
            pending.append(batch)
            held += batch.num_rows
            if held >= ROW_GROUP_ROWS:
                writer = writer or parquet_writer(path, STAGE_ARROW)
                writer.write_table(pa.Table.from_batches(pending), row_group_size=held)
                count, pending, held = count + held, [], 0
        if held:
            writer = writer or parquet_writer(path, STAGE_ARROW)
            writer.write_table(pa.Table.from_batches(pending), row_group_size=held)
            count += held
    finally:
        if writer is not None:
            writer.close()
    return count


def _stage_tasks(
    spark: SparkSession,
    specs: list[KeySpec],
    per_lane: set[GroupKey],
    partitions: int,
    split: set[GroupKey],
) -> tuple[list[_Task], DataFrame]:
    """The event-by-event stage's tasks, and its input: their positions, spread evenly."""
    whole = [s for s in specs if s.key not in per_lane | split]
    parts = output_parts(spark.sparkContext.defaultParallelism, whole)
    tasks = _tasks(specs, per_lane, split, parts)
    positions = spark.range(len(tasks), numPartitions=max(1, min(partitions, len(tasks))))
    return tasks, positions


def retry_owner_attempts(
    spark: SparkSession, specs: list[KeySpec], sent: DataFrame, heartbeats: str | None = None
) -> DataFrame:
    """The retry owners' rows of the groups ``specs`` that run in units, each group's
    owners' unit in tasks of one stage (as many as :func:`output_parts` gives, each writing
    its share of the rows as in :func:`sequential_attempts`), fed the retries ``sent``: the
    deliveries the other units' rows lead to at the retry owners (a frame of ``group`` and
    :data:`IMPORTED`, as
    :func:`retrysim.engine.rounds.next_frontier` gives them)."""
    parts = output_parts(spark.sparkContext.defaultParallelism, specs)
    tasks = [_Task(index, None, part, parts, (units_of(spec).retry_owners, ()))
             for index, spec in enumerate(specs) for part in range(parts)]  # fmt: skip
    # a value of the task column for each task that Spark's hash sends to a partition of
    # its own; every task gets a row, retries or not
    value = _partition_keys(spark, len(tasks))
    keyed = spark.createDataFrame(
        [(value[t], t, specs[task.spec].group) for t, task in enumerate(tasks)],
        "_key int, _task int, group string",
    )
    retries = sent.join(F.broadcast(keyed), "group").select("_key", "_task", *IMPORTED)
    rows = keyed.drop("group").unionByName(retries, allowMissingColumns=True)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        data = pa.Table.from_batches(list(batches)).to_pandas(types_mapper=pandas_nullable)
        for position, imports in data.groupby("_task", sort=True):
            task = tasks[int(position)]
            yield from _simulate_one(
                specs[task.spec], task, (1 << 20) + int(position), heartbeats, None,
                imports=imports.dropna(subset=["msg_id"]),
            )  # fmt: skip

    return rows.repartition(len(tasks), "_key").mapInArrow(run, STAGE)


def _partition_keys(spark: SparkSession, count: int) -> list[int]:
    """For each of ``count`` hash partitions, an int that ``repartition(count, column)``
    sends there (Spark's Murmur3 ``hash``, modulo ``count``)."""
    found = (
        spark.range(64 * count)
        .select(
            F.col("id").cast("int").alias("value"),
            F.expr(f"pmod(hash(cast(id as int)), {count})").alias("partition"),
        )
        .groupBy("partition")
        .agg(F.min("value").alias("value"))
        .collect()
    )
    value = {row["partition"]: row["value"] for row in found}
    return [value[partition] for partition in range(count)]


MOST_OUTPUT_PARTS = 4  # each part holds the whole key's messages: bounds a key's memory


def output_parts(cores: int, whole: list[KeySpec]) -> int:
    """How many tasks simulate each of the groups ``whole`` (each simulated whole by a
    task): the cores each would have to itself, up to :data:`MOST_OUTPUT_PARTS`."""
    return max(1, min(MOST_OUTPUT_PARTS, cores // len(whole))) if whole else 1


def _shares(task: _Task) -> frozenset[str]:
    """What a task sums up of its whole group (retrysim.tables.key_peaks): all of it alone,
    else the first two of its parts a share each (each part simulates all of the rows): the
    peaks of the first set of buckets with the rates, and those of the other with the counts
    (:data:`~retrysim.tables.group_sums.PEAK_HALVES`)."""
    if task.parts == 1:
        return SHARES
    first, other = (frozenset({half}) for half in PEAK_HALVES)
    return {0: first | {RATES}, 1: other | {COUNTS}}.get(task.part, frozenset())


def _simulate_one(
    spec: KeySpec,
    task: _Task,
    heartbeat_id: int,
    heartbeats: str | None,
    sums: Accumulator | None,
    messages: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    imports: pd.DataFrame | None = None,
) -> Iterator[pa.RecordBatch]:
    """A task's rows, or with ``task.parts`` > 1 its ``part`` of them: each batch goes to
    the part that has kept the fewest rows so far, the first on a tie (every task makes the
    same batches of the same rows, so the parts agree); part 0 beats the key's
    heartbeat, and parts 0 and 1 sum up a whole group's rows. ``messages``: the key's
    messages as :func:`~retrysim.model.workload.messages_np` makes them, if made already."""
    if messages is None:
        messages = messages_np(spec.workload, spec.group, spec.seed, task.lane)
    msg_ids, queue_ids, born = messages
    heartbeat = Heartbeat(heartbeats if task.part == 0 else None, heartbeat_id, spec.horizon_ms)
    batches = simulate_key(
        spec, msg_ids, queue_ids, born, heartbeat, unit=task.unit, imports=imports,
        chunks=True,
    )  # fmt: skip
    whole = task.lane is None and task.unit is None
    shares = _shares(task)
    if whole and sums is not None and shares:
        summer = GroupSummer(
            spec.group,
            spec.horizon_ms,
            spec.load_bucket_ms,
            spec.shared,
            pops_of(spec.policy),
            shares,
        )
        batches = map(summer.add, batches)
    else:
        summer = None
    written = [0] * task.parts  # rows each part has written: a batch goes to the fewest
    for batch in batches:
        if not batch.num_rows:
            continue
        part = written.index(min(written))
        written[part] += batch.num_rows
        if part == task.part:
            yield as_batch(batch)
    if summer is not None:
        sums.add({spec.key: summer.finish()})


@dataclass(frozen=True)
class EventRun:
    """A run's groups to simulate event by event, and its staging folder."""

    scenario: Scenario
    plans: list[GroupPlan]
    staging: str


def run_events(
    spark: SparkSession,
    runs: list[EventRun],
    say: Progress,
    unit_messages: int,
    fewest_units: int = 1,
    task_tables: tuple[str, ...] = (),
) -> list[dict[str, GroupSums]]:
    """Simulate the runs' ``plans`` event by event in one stage, staging each run's
    attempts; a group in units (:func:`units_of`) with at least ``unit_messages`` messages
    and ``fewest_units`` units besides its retry owners' runs as its units (one run only).
    Returns each run's sums of the groups simulated whole in a task."""
    specs = [spec for k, run in enumerate(runs) for spec in key_specs(run.scenario, run.plans, k)]
    per_lane = per_lane_groups(specs, [plan for run in runs for plan in run.plans])
    split = in_units(specs, per_lane, unit_messages, fewest_units)
    assert not split or len(runs) == 1, "units run for one run at a time"
    if split or any(
        s.key in per_lane and s.workload.messages > LANES_SCANNED_MESSAGES for s in specs
    ):
        full_jit(spark)  # staging scans the rows of units and lanes in Spark
    keys = key_count(specs, per_lane, split)
    for spec in specs:
        if spec.key in split:
            units = units_of(spec)
            say(
                f"group {spec.group} in units: {_instances(sum(units.first, ()))} on "
                f"{'their' if len(units.first) > 1 else 'its'} own, then "
                f"{_instances(units.retry_owners)} (the retry queues'), fed the retries "
                "sent to them"
            )
    named = ", ".join(p.name for p in runs[0].plans)
    whose = f"{len(runs)} runs' groups" if len(runs) > 1 else named
    say(
        f"event-by-event simulation of {whose} "
        f"({keys:,} independent {'keys' if keys > 1 else 'key'}) ..."
    )
    began = time.monotonic()
    partitions = max(spark.sparkContext.defaultParallelism, min(keys, 200))
    # up to 200 partitions balance the keys; each task writes its keys' rows as files of the
    # attempts table
    outputs = [_folders(number, run, specs, per_lane, split, task_tables)
               for number, run in enumerate(runs)]  # fmt: skip
    heartbeats = os.path.join(runs[0].staging, "heartbeats")
    sums = spark.sparkContext.accumulator({}, GroupSumsParam())
    with _watching(heartbeats, keys, say):
        write_runs_attempts(spark, specs, per_lane, partitions, outputs, heartbeats, sums, split)
    beats = read_heartbeats(heartbeats)
    if split:
        keys += len(split)
        owners_beats = os.path.join(heartbeats, "retry-owners")
        path = outputs[0].attempts
        _run_retry_owners(
            spark, [spec for spec in specs if spec.key in split], path, owners_beats, say
        )
        beats += read_heartbeats(owners_beats)
    shutil.rmtree(heartbeats, ignore_errors=True)
    if len(beats) == keys and all(beat["sim_ms"] == beat["horizon_ms"] for beat in beats):
        count = sum(beat["deliveries"] for beat in beats)  # every key's last word
    else:  # a key without messages, or an executor that cannot write the folder
        folders = [os.path.dirname(out.attempts) for out in outputs]
        count = spark.read.parquet(*folders).where(F.col("start_ms").isNotNull()).count()
    say(f"event-by-event: {count:,} deliveries, {time.monotonic() - began:.1f}s")
    return [
        {group: part for (run, group), part in sums.value.items()
         if run == number and part.complete}
        for number in range(len(runs))
    ]  # fmt: skip


def per_lane_groups(specs: list[KeySpec], plans: list[GroupPlan]) -> set[GroupKey]:
    """The groups (of ``plans``, with their ``specs``) simulated a queue at a time."""
    pairs = zip(specs, plans, strict=True)
    return {spec.key for spec, plan in pairs if lanes_are_independent(plan)}


def _folders(
    number: int,
    run: EventRun,
    specs: list[KeySpec],
    per_lane: set[GroupKey],
    split: set[GroupKey],
    task_tables: tuple[str, ...],
) -> RunFolders:
    """Where the stage writes the ``number``-th run's files: its attempts, and the task
    tables when every group of it is simulated whole in a task (dead letters only where
    nothing is replayed)."""
    attempts = os.path.join(run.staging, "attempts", f"engine={ENGINE_SEQUENTIAL}", "round=00000")
    mine = [spec for spec in specs if spec.run == number]
    everyone = {plan.name for plan in run.plans} == {group.name for group in run.scenario.groups}
    if not everyone or any(spec.key in per_lane | split for spec in mine):
        return RunFolders(attempts)  # staging makes them in Spark, for every group
    if any(plan.policy.replay is not None for plan in run.plans):
        task_tables = tuple(table for table in task_tables if table != "dead_letters")
    if not task_tables:
        return RunFolders(attempts)
    return RunFolders(attempts, os.path.join(run.staging, TASK_TABLES_DIR), task_tables)


def in_units(
    specs: list[KeySpec], per_lane: set[GroupKey], unit_messages: int, fewest_units: int = 1
) -> set[GroupKey]:
    """The groups that run as their units: those in units (:func:`units_of`, not per
    lane) with at least ``unit_messages`` messages and ``fewest_units`` units besides the
    retry owners'."""
    return {
        spec.key
        for spec in specs
        if spec.key not in per_lane
        and (units := units_of(spec)) is not None
        and len(units.first) >= fewest_units
        and spec.workload.messages >= unit_messages
    }


def _run_retry_owners(
    spark: SparkSession, specs: list[KeySpec], first: str, heartbeats: str, say: Progress
) -> None:
    """The second step of the groups run in units (docs/model.md §5, "Units"): their retry
    owners, fed the retries the other units' rows (in ``first``) sent them, written beside
    those rows."""
    owners = "; ".join(f"{spec.group}: {_instances(units_of(spec).retry_owners)}" for spec in specs)
    say(f"event by event: the retry queues' owners ({owners}) ...")
    rows = spark.read.parquet(first)
    sent = union_all(
        [
            next_frontier(rows.where(F.col("group") == spec.group), spec.horizon_ms).where(
                spec.policy.topology.instance_col().isin(*units_of(spec).retry_owners)
            )
            for spec in specs
        ]
    )
    attempts = retry_owner_attempts(spark, specs, sent, heartbeats)
    with _watching(heartbeats, len(specs), say):
        attempts.write.parquet(os.path.join(os.path.dirname(first), "round=00001"))


def _instances(numbers: tuple[int, ...]) -> str:
    return f"instance{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"


HEARTBEAT_EVERY_S = 6.0  # within runner.QUIET_S: the heartbeat is the stage's line


@contextmanager
def _watching(folder: str, keys: int, say: Progress) -> Iterator[None]:
    """While the event-by-event stage runs, say every :data:`HEARTBEAT_EVERY_S` seconds how
    far its keys got (:func:`heartbeat_line`)."""
    began, stop = time.monotonic(), threading.Event()

    def watch() -> None:
        while not stop.wait(HEARTBEAT_EVERY_S):
            line = heartbeat_line(read_heartbeats(folder), keys, time.monotonic() - began)
            if line:
                say(line)

    watcher = threading.Thread(target=watch, name="retrysim-heartbeat", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def heartbeat_line(beats: list[dict], keys: int, elapsed_s: float) -> str | None:
    """The progress of the event-by-event stage from its keys' heartbeats: the simulated
    time reached (the least among keys still running), deliveries so far, and the time left
    at the pace so far of first deliveries, most of the work (a key not heard from yet
    counts as not started); None before any key has sent one."""
    if not beats:
        return None
    done = sum(b["first"] / b["messages"] if b["messages"] else 1.0 for b in beats) / keys
    running = [b for b in beats if b["sim_ms"] < b["horizon_ms"]] or beats
    reached = min(running, key=lambda b: b["sim_ms"] / b["horizon_ms"])
    deliveries = sum(b["deliveries"] for b in beats)
    left = f", about {human_ms(1000 * elapsed_s * (1 - done) / done)} left" if 0 < done < 1 else ""
    return (
        f"event by event: simulated {human_ms(reached['sim_ms'])} of "
        f"{human_ms(reached['horizon_ms'])}, {deliveries:,} deliveries, {done:.0%} of the "
        f"messages delivered once, {elapsed_s:.0f}s elapsed{left}"
    )


def lanes_are_independent(plan: GroupPlan) -> bool:
    """Ordered queues are independent when the pool can never be full and no replay moves
    messages between them. A queue runs one consume request at a time, so a pool with a
    thread per queue never fills up -- unless a timeout lets the queue move on while the
    timed-out listener still holds its thread. Each instance needs a thread for every queue
    whose deliveries it may run (by message: every queue)."""
    policy = plan.policy
    threads = policy.topology.threads
    return (
        policy.blocking
        and policy.batch_size == 1
        and policy.replay is None
        and plan.group.behavior.downstream is None  # its calls tie the queues together
        and (
            threads is None
            or (policy.timeout_ms is None and threads >= policy.topology.most_lanes_per_instance)
        )
    )
