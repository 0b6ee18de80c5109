"""The round engine: one Spark stage per delivery round over the frontier.

Round k holds every message's k-th delivery; one stage runs a round of every run simulated
together (a plan's points and replications, told apart by a :data:`RUN` column), and each
run gets the rounds, rows and files it gets alone. The stage draws the listener result, applies
the flavor's timeout and retry rules, and writes the round's attempts as Parquet in the
attempts table's columns (they are published as the table's files, not rewritten); the
next frontier is re-read from those files (WaitingRetry rows due before the horizon), so
lineage never grows across rounds and the driver only ever sees counts. A thin frontier's
rounds are held in executor memory instead and written together (:data:`THIN_ROWS`).

This is exact when deliveries of a group do not interact: unordered consumption with a
consumer pool that is never full (every Ready delivery starts when it is eligible). Ordered
queues, batches and full pools are handled by :mod:`retrysim.engine.event_stage`; the runner checks
a finished round run against the pool size (:mod:`retrysim.engine.capacity`) and re-runs a group
sequentially when its pool would have been full.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from retrysim.engine.event_key import KeySpec, pandas_nullable, simulate_key
from retrysim.model.behavior import listener_draw_columns
from retrysim.model.policy import Policy, next_reconsume_columns, policy_for
from retrysim.model.states import (
    DLQ,
    INFLIGHT,
    READY,
    READY_PUBLISHED,
    READY_REPLAYED,
    WAITING_RETRY,
)
from retrysim.model.workload import all_messages
from retrysim.progress import Progress
from retrysim.scenario.limits import TAIL_ROWS
from retrysim.scenario.spec import Group, Scenario
from retrysim.tables.schemas import LATE_SEND_BACK_COLUMNS, STAGE, schema_columns

if TYPE_CHECKING:  # the round tail's pandas UDF loads it on its workers alone
    import pandas as pd

ENGINE_ROUNDS = "rounds"  # the engine column of its groups' summaries, its staging folder

# A frontier this thin is not worth a Parquet round trip per round: its rounds are kept in
# executor memory (localCheckpoint, lineage cut as with the files) and written together once
# the frontier is done: a round's write, re-read and count cost the same whatever its size,
# and in memory a thin round costs a fraction of that.
THIN_ROWS = 200_000
# Held rounds are written once they hold this many rows, so executor memory stays bounded
# (an HTTP group's poison messages retry for 289 rounds).
HELD_ROWS = 1_000_000

# How Spark splits file scans, which run_rounds sets per frontier (frontier_split_bytes).
MAX_PARTITION_BYTES = "spark.sql.files.maxPartitionBytes"
OPEN_COST_BYTES = "spark.sql.files.openCostInBytes"
MIN_PARTITION_NUM = "spark.sql.files.minPartitionNum"


def open_cost_bytes(spark: SparkSession) -> int:
    """``spark.sql.files.openCostInBytes`` in bytes, as Spark parsed it (a user may set
    ``8m``, which the session's string value keeps as written)."""
    return int(spark._jsparkSession.sessionState().conf().filesOpenCostInBytes())


def frontier_read(split: int) -> dict[str, str]:
    """The session settings under which Spark splits a scan at ``split`` bytes."""
    return {MAX_PARTITION_BYTES: str(split), MIN_PARTITION_NUM: "1"}


# What a frontier row carries into its round.
FRONTIER_COLUMNS = (
    "group",
    "msg_id",
    "delivery",
    "reconsume_times",
    "broker_reconsume_times",
    "source_topic",
    "queue_id",
    "born_ms",
    "ready_ms",
    "ready_reason",
    "poison_fixed",
)
# set when the delivery is given to an instance, before it starts
ASSIGNED = "consumer_instance"
_AFTER_READY = tuple(
    f.name
    for f in STAGE.fields
    if f.name not in (*FRONTIER_COLUMNS, ASSIGNED, *LATE_SEND_BACK_COLUMNS)
)
_AFTER_START = (
    "end_ms",
    "outcome",
    "delay_level",
    "next_ready_ms",
    "settled_ms",
    *tuple(name for name in _AFTER_READY if name.startswith(("end_", "leave_", "next_"))),
)
_LEAVE_COLUMNS = ("leave_state", "leave_topic", "leave_queue_id", "leave_reason", "settled_ms")


@dataclass(frozen=True)
class GroupPlan:
    """A group's validated config with its policy."""

    group: Group
    policy: Policy

    @property
    def name(self) -> str:
        return self.group.name


def group_plans(scenario: Scenario) -> list[GroupPlan]:
    table = scenario.broker.message_delay_level
    return [GroupPlan(group, policy_for(group, table)) for group in scenario.groups]


def union_all(frames: list[DataFrame]) -> DataFrame:
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def first_frontier(messages: DataFrame, horizon_ms: int) -> DataFrame:
    """Delivery 1 of every message published before the horizon."""
    return messages.where(F.col("born_ms") < F.lit(horizon_ms)).select(
        "group",
        "msg_id",
        F.lit(1).alias("delivery"),
        F.lit(0).alias("reconsume_times"),
        F.lit(0).alias("broker_reconsume_times"),
        F.col("topic").alias("source_topic"),
        "queue_id",
        "born_ms",
        F.col("born_ms").alias("ready_ms"),
        F.lit(READY_PUBLISHED).alias("ready_reason"),
        F.lit(False).alias("poison_fixed"),
    )


def with_horizon_cut(df: DataFrame, horizon_ms: int) -> DataFrame:
    """Apply docs/model.md §7: not started by the horizon → Ready; still running → Inflight;
    an after-backoff leave due at or after it → still WaitingRetry."""
    return df.withColumns(horizon_cut_columns(horizon_ms))


def horizon_cut_columns(horizon_ms: int | Column) -> dict[str, Column]:
    """The columns :func:`with_horizon_cut` replaces, as expressions."""
    horizon = F.lit(horizon_ms)
    not_started = F.col("start_ms") >= horizon
    running = F.col("end_ms") >= horizon
    late_leave = F.col("leave_state").isNotNull() & (F.col("settled_ms") >= horizon)
    columns = {name: F.when(~not_started, F.col(name)) for name in _AFTER_READY}
    columns.update({name: F.when(~not_started & ~running, F.col(name)) for name in _AFTER_START})
    columns.update(
        {
            name: F.when(~not_started & ~running & ~late_leave, F.col(name))
            for name in _LEAVE_COLUMNS
        }
    )
    columns["result_state"] = (
        F.when(not_started, F.lit(READY))
        .when(running, F.lit(INFLIGHT))
        .when(late_leave, F.lit(WAITING_RETRY))
        .otherwise(F.col("result_state"))
    )
    return columns


@dataclass(frozen=True)
class RoundRun:
    """A run of a batch for the round engine: its groups by rounds, and the folder its round
    files end up in (``round=<NNNNN>`` folders, as a run alone writes them)."""

    scenario: Scenario
    plans: list[GroupPlan]
    staging_dir: str


class Round:
    """A round of every group of every run as column expressions, built once per batch and
    applied to each frontier (:meth:`attempts`): building them takes thousands of calls into
    the JVM, applying them a dozen. Runs with the same group (a plan's replications) share
    its expressions, their seeds and horizons by the frontier's :data:`RUN` column: the
    round's plan and generated code grow with the batch's different groups, not its runs."""

    def __init__(self, runs: list[RoundRun]) -> None:
        shared: list[tuple[GroupPlan, list[int]]] = []  # each group, and the runs that have it
        for number, run in enumerate(runs):
            for plan in run.plans:
                found = next((numbers for other, numbers in shared if other == plan), None)
                if found is None:
                    shared.append((plan, [number]))
                else:
                    found.append(number)
        self.groups: list[tuple[str, list[int], Column, list[dict[str, Column]]]] = []
        for plan, numbers in shared:
            policy = plan.policy
            helpers: dict[str, Column] = {}
            seed = per_run(runs, numbers, lambda run: run.scenario.seed)
            if isinstance(seed, Column):  # once a row, for the draws' every hash
                seed, helpers[_SEED] = F.col(_SEED), seed
            horizon_ms = per_run(runs, numbers, lambda run: run.scenario.horizon)
            if isinstance(horizon_ms, Column):
                horizon_ms, helpers[_HORIZON] = F.col(_HORIZON), horizon_ms
            draws = listener_draw_columns(plan.group.behavior, seed, plan.name)
            cases, steps = policy.next_step_columns()
            projections = [
                *([helpers] if helpers else []),
                {
                    "start_ms": policy.eligible_col(F.col("ready_ms")),
                    ASSIGNED: policy.topology.instance_col(),
                },
                draws,
                policy.consume_result_columns(),
                cases,
                {**steps, "batch_size": F.lit(1)},
                horizon_cut_columns(horizon_ms),
            ]
            rows = (F.col("group") == F.lit(plan.name)) & F.col(RUN).isin(*numbers)
            self.groups.append((plan.name, numbers, rows, projections))
        # no delivery is sent back twice by rounds (choice.needs_events)
        self.stage = [
            F.lit(None).cast(STAGE[c.name].dataType).alias(c.name)
            if c.name in LATE_SEND_BACK_COLUMNS else column
            for c, column in zip(STAGE.fields, schema_columns(STAGE), strict=True)
        ] + [F.col(RUN)]  # fmt: skip

    def attempts(
        self, frontier: DataFrame | dict[tuple[int, str], DataFrame], runs: list[int]
    ) -> DataFrame:
        """One round of the runs ``runs`` (those with a frontier): each frontier row becomes
        one staged attempt row, with its run. ``frontier``: one frame of every run and group,
        or one frame each (round 1: filtering their union, the optimizer would push every
        group's filter into every other's messages, a plan growing with their square)."""
        frames = []
        for name, numbers, rows_of_group, projections in self.groups:
            mine = [number for number in numbers if number in runs]
            if not mine:
                continue  # done: its scan would read the frontier for nothing
            if isinstance(frontier, dict):
                frame = functools.reduce(DataFrame.union, [frontier[(n, name)] for n in mine])
            else:
                frame = frontier.where(rows_of_group)
            for columns in projections:
                frame = frame.withColumns(columns)
            frames.append(frame.select(*self.stage))  # the helper columns go
        # by position, each in STAGE's columns: unionByName would resolve every column of
        # the growing union again at each step
        return functools.reduce(DataFrame.union, frames)


# a Round's columns of each row's seed and horizon, where the runs sharing a group differ
_SEED, _HORIZON = "_seed", "_horizon"


def per_run(
    runs: list[RoundRun], numbers: list[int], value: Callable[[RoundRun], int]
) -> int | Column:
    """``value`` of each row's run among the runs ``numbers`` (by :data:`RUN`): a literal
    where they share it."""
    by_value: dict[int, list[int]] = {}
    for number in numbers:
        by_value.setdefault(value(runs[number]), []).append(number)
    if len(by_value) == 1:
        return next(iter(by_value))
    column = None
    for known, having in by_value.items():
        column = (F if column is None else column).when(F.col(RUN).isin(*having), F.lit(known))
    return column


def retries_due(horizon_ms: int | Column) -> Column:
    """Whether an attempt row leads to another delivery: WaitingRetry (or, 5.x simple,
    Inflight until visible again), due before the horizon (a column where runs differ)."""
    return F.col("next_topic").isNotNull() & (F.col("next_ready_ms") < F.lit(horizon_ms))


def next_frontier(
    attempts: DataFrame, horizon_ms: int | Column, keep: tuple[str, ...] = ()
) -> DataFrame:
    """The deliveries that WaitingRetry rows lead to, when due before the horizon; with the
    columns ``keep`` (a batch's :data:`RUN`) as they are."""
    counted, kept = next_reconsume_columns(
        F.col("reconsume_times"), F.col("broker_reconsume_times"), F.col("end_reason")
    )
    return attempts.where(retries_due(horizon_ms)).select(
        *keep,
        "group",
        "msg_id",
        (F.col("delivery") + 1).alias("delivery"),
        counted.alias("reconsume_times"),
        kept.alias("broker_reconsume_times"),
        F.col("next_topic").alias("source_topic"),
        F.col("next_queue_id").alias("queue_id"),
        "born_ms",
        F.col("next_ready_ms").alias("ready_ms"),
        F.col("next_reason").alias("ready_reason"),
        "poison_fixed",
    )


def replay_frontier(attempts: DataFrame, plans: list[GroupPlan], horizon_ms: int) -> DataFrame:
    """docs/model.md §8: the dead letters of groups with ``replay``, re-published at ``at``
    at ``rate``, in order of their DLQ moment."""
    frames = []
    for plan in plans:
        replay = plan.policy.replay
        if replay is None:
            continue
        order = Window.partitionBy("group").orderBy("settled_ms", "msg_id")
        rank = F.row_number().over(order) - F.lit(1)
        frames.append(
            attempts.where(
                (F.col("group") == F.lit(plan.name))
                & (F.col("result_state") == F.lit(DLQ))
                & (F.col("settled_ms") < F.lit(replay.at))
            )
            .withColumn("rank", rank)
            .select(
                "group",
                "msg_id",
                (F.col("delivery") + 1).alias("delivery"),
                F.lit(0).alias("reconsume_times"),
                F.lit(0).alias("broker_reconsume_times"),
                F.lit(plan.group.source_topic).alias("source_topic"),
                (F.col("rank") % F.lit(plan.group.workload.queues)).cast("int").alias("queue_id"),
                "born_ms",
                (F.lit(replay.at) + F.floor(F.col("rank") * F.lit(1000.0 / replay.rate)))
                .cast("long")
                .alias("ready_ms"),
                F.lit(READY_REPLAYED).alias("ready_reason"),
                F.lit(replay.poison_fixed).alias("poison_fixed"),
            )
            .where(F.col("ready_ms") < F.lit(horizon_ms))
        )
    return union_all(frames) if frames else None


def key_specs(scenario: Scenario, plans: list[GroupPlan], run: int = 0) -> list[KeySpec]:
    """What the sequential engine needs to simulate each of ``plans``' groups (of the
    ``run``-th of the runs simulated together)."""
    return [
        KeySpec(
            group=plan.name,
            topic=plan.group.source_topic,
            policy=plan.policy,
            behavior=plan.group.behavior,
            seed=scenario.seed,
            horizon_ms=scenario.horizon,
            queues=plan.group.workload.queues,
            workload=plan.group.workload,
            load_bucket_ms=scenario.load_bucket,
            shared=plan.policy.topology.shared,
            run=run,
        )
        for plan in plans
    ]


@dataclass
class _RunState:
    """Where a run of a batch is: its own round count, whether it replays, whether done."""

    rounds: int = 0
    replayed: bool = False
    done: bool = False


def run_rounds(
    spark: SparkSession,
    runs: list[RoundRun],
    batch_dir: str,
    progress: Progress = lambda _line: None,
    tail_rows: int = TAIL_ROWS,
) -> list[int]:
    """Run every round of every run in ``runs`` together: one Spark stage a round for all
    of them, each run's rows told apart by :data:`RUN`, until no delivery is left or a
    run's frontier is thin enough to finish event by event; then a run's replay rounds,
    if a group of it replays its dead letters. Returns each run's number of rounds.

    Each run goes through exactly the rounds it goes through alone (its own thin tail, its
    own replay), so its rows are the same; runs at different rounds share a stage. The
    rounds are written under ``batch_dir`` by run (``step=<n>/_run=<k>``) and each run's
    folders are moved into its ``staging_dir`` at the end as ``round=<its round>``, without
    the run column: the files a run alone writes.

    The driver sees only two counts per run and round, and the sizes of a round's files.
    """
    frontier: DataFrame | dict[tuple[int, str], DataFrame] | None = {
        (number, plan.name): first_frontier(
            all_messages(spark, run.scenario, [plan.group]), run.scenario.horizon
        ).select(F.lit(number).alias(RUN), *FRONTIER_COLUMNS)
        for number, run in enumerate(runs)
        for plan in run.plans
    }
    horizon = per_run(runs, list(range(len(runs))), lambda run: run.scenario.horizon)
    partitions = spark.sparkContext.defaultParallelism
    open_cost = open_cost_bytes(spark)
    split = None  # the split size for the next round's frontier, if not Spark's own
    started = time.monotonic()
    step = 0  # the batch's stages so far: a run alone counts its rounds so
    states = [_RunState() for _ in runs]
    written: list[tuple[str, dict[int, int]]] = []  # a batch folder, its runs' round numbers
    held = _HeldRounds(batch_dir, partitions, written)
    round_ = Round(runs)
    thin, frontier_rows = False, 0  # the first frontier is every message: never thin
    while True:
        active = [number for number, state in enumerate(states) if not state.done]
        step += 1
        for number in active:
            states[number].rounds += 1
        rounds = {number: states[number].rounds for number in active}
        # counted while written or held: no second pass over the round's rows
        observed = Observation()
        counted = [F.count(F.col("start_ms")).alias("started")] + [
            F.sum(
                F.when(
                    F.col(RUN) == F.lit(number),
                    retries_due(runs[number].scenario.horizon).cast("long"),
                )
            ).alias(f"retrying{number}")
            for number in active
        ]
        attempts = round_.attempts(frontier, active).observe(observed, *counted)
        with conf_set(spark, frontier_read(split) if split else {}):  # read when planned
            if thin:
                staged, split = held.add(rounds, attempts, frontier_rows), None
            else:
                path = f"{batch_dir}/step={step:05d}"
                write_by_run(attempts, path, active)
                written.append((path, rounds))
                split = frontier_split_bytes(parquet_file_sizes(path), partitions, open_cost)
                staged = spark.read.parquet(path)
        counts = observed.get
        retrying = {number: counts[f"retrying{number}"] or 0 for number in active}
        total = sum(retrying.values())
        replaying = sum(states[number].replayed for number in active)
        replays = (
            "" if not replaying else " (replay)" if replaying == len(active)
            else f" ({replaying} of {len(active)} runs replay)"
        )  # fmt: skip
        progress(
            f"round {step}{replays}: {counts['started']:,} deliveries, {total:,} to retry, "
            f"{time.monotonic() - started:.1f}s elapsed{' (in memory)' if thin else ''}"
        )
        frontier = next_frontier(staged, horizon, (RUN,))
        thin, frontier_rows = total <= THIN_ROWS, total
        if held.rows >= HELD_ROWS:
            held.write()
        tails = [number for number in active if 0 < retrying[number] <= tail_rows]
        if tails:
            step += 1
            for number in tails:
                states[number].rounds += 1
            specs = [
                spec
                for number in tails
                for spec in key_specs(runs[number].scenario, runs[number].plans, number)
            ]
            path = f"{batch_dir}/step={step:05d}"
            write_by_run(frontier_attempts(_of_runs(frontier, tails, active), specs, partitions),
                         path, tails)  # fmt: skip
            written.append((path, {number: states[number].rounds for number in tails}))
            finished = spark.read.parquet(path).where(F.col("start_ms").isNotNull()).count()
            left = sum(retrying[number] for number in tails)
            whose = f" of {len(tails)} runs" if len(tails) > 1 else ""
            progress(
                f"rounds {step}+: {left:,} messages{whose} still retrying, finished event by "
                f"event: {finished:,} deliveries, {time.monotonic() - started:.1f}s elapsed"
            )
            retrying.update(dict.fromkeys(tails, 0))
        going = [number for number in active if retrying[number] > 0]
        ended = [number for number in active if retrying[number] == 0]
        if ended:
            held.write()  # a run's replay reads its rows so far
            again = [_replay(spark, runs, states, written, number) for number in ended]
            again = [replay for replay in again if replay is not None]
            thin = thin and not again  # a replay's first round is never thin
            parts = ([_of_runs(frontier, going, active)] if going else []) + again
            frontier = union_all(parts) if parts else None
        if frontier is None:
            break
    _move_rounds(spark, runs, states, written)
    shutil.rmtree(batch_dir, ignore_errors=True)
    return [state.rounds for state in states]


def _of_runs(frontier: DataFrame, numbers: list[int], among: list[int]) -> DataFrame:
    """The rows of the runs ``numbers`` of a frontier holding the runs ``among``."""
    return frontier if len(numbers) == len(among) else frontier.where(F.col(RUN).isin(*numbers))


def _replay(
    spark: SparkSession,
    runs: list[RoundRun],
    states: list[_RunState],
    written: list[tuple[str, dict[int, int]]],
    number: int,
) -> DataFrame | None:
    """The ``number``-th run's replay frontier once its rounds have no delivery left
    (None, and the run done, when it has replayed already or has nothing to replay)."""
    state, run = states[number], runs[number]
    folders = [f"{path}/{RUN}={number}" for path, rounds in written if number in rounds]
    folders = [folder for folder in folders if os.path.isdir(folder)]
    if state.replayed or not folders:
        state.done = True
        return None
    state.replayed = True
    frontier = replay_frontier(spark.read.parquet(*folders), run.plans, run.scenario.horizon)
    if frontier is None or frontier.isEmpty():
        state.done = True
        return None
    return frontier.select(F.lit(number).alias(RUN), *FRONTIER_COLUMNS)


def write_by_run(attempts: DataFrame, folder: str, numbers: list[int]) -> None:
    """Write a batch's round (rows of the runs ``numbers``) as ``folder/_run=<k>``: each
    run's files without the run column, as the run alone writes them (one run: no
    partitioned write, which would sort its rows by a single value)."""
    if len(numbers) == 1:
        attempts.drop(RUN).write.parquet(f"{folder}/{RUN}={numbers[0]}")
    else:
        attempts.write.partitionBy(RUN).parquet(folder)


def _move_rounds(
    spark: SparkSession,
    runs: list[RoundRun],
    states: list[_RunState],
    written: list[tuple[str, dict[int, int]]],
) -> None:
    """Each run's folders of the batch into its staging folder, as ``round=<its round>``
    (a run without a row gets its round 1 as an empty file, as alone)."""
    for path, rounds in written:
        for number, round_no in rounds.items():
            source = f"{path}/{RUN}={number}"
            if os.path.isdir(source):
                os.makedirs(runs[number].staging_dir, exist_ok=True)
                os.replace(source, f"{runs[number].staging_dir}/round={round_no:05d}")
    for run in runs:
        if not os.path.isdir(run.staging_dir):
            empty = spark.createDataFrame([], STAGE).coalesce(1)
            empty.write.parquet(f"{run.staging_dir}/round=00001")


def frontier_split_bytes(sizes: list[int], cores: int, open_cost: int) -> int | None:
    """The split size (``spark.sql.files.maxPartitionBytes``) at which Spark reads a round's
    files (``sizes``) as few tasks as keep every core busy to the end, or None to keep
    Spark's own split.

    Spark packs files into tasks of up to the split size, next fit by decreasing size, and
    splits files over it. Its default split (128 MB) can pack a round's files into one task
    more than the cores, so the last runs alone; fewer, bigger tasks are also faster. Here
    every task takes ``k`` whole files, the
    ``k`` whose tasks finish soonest on ``cores`` cores, the fewest tasks among equals; the
    split fits ``k`` files and not ``k + 1``, which holds when the files are about the same
    size, as a round's are (one per task of the round before): Spark's lower bound on the
    split (the bytes a core would read, total / ``spark.sql.files.minPartitionNum``) must
    be lifted (:func:`frontier_read`)."""
    if len(sizes) <= 1:
        return None
    biggest, smallest = max(sizes), min(sizes)

    def finish(per_task: int) -> int:  # in files, the tasks taken in order by free cores
        tasks = [per_task] * (len(sizes) // per_task) + [len(sizes) % per_task]
        busy = [0] * cores
        for files in sorted((t for t in tasks if t), reverse=True):
            busy[busy.index(min(busy))] += files
        return max(busy)

    most = -(-len(sizes) // cores)  # files a task takes when there is one task a core
    # k + 1 files of the smallest size outgrow k of the biggest
    fitting = [k for k in range(1, most + 1) if k * (biggest - smallest) < smallest // 2]
    if not fitting:
        return None
    per_task = min(fitting, key=lambda k: (finish(k), -k))
    return per_task * (biggest + open_cost) + smallest // 2


def parquet_file_sizes(folder: str) -> list[int]:
    """The sizes of the Parquet files in a local ``folder`` and its partition folders (none
    for other file systems)."""
    if not os.path.isdir(folder):
        return []
    sizes = []
    for entry in os.scandir(folder):
        if entry.is_dir() and "=" in entry.name:
            sizes += parquet_file_sizes(entry.path)
        elif entry.name.endswith(".parquet"):
            sizes.append(entry.stat().st_size)
    return sizes


@contextmanager
def conf_set(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """The session's ``settings`` for the block, then each key as it was."""
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


class _HeldRounds:
    """Rounds of a thin frontier, held in executor memory until :meth:`write` stages them
    as one folder by run (named after the first of them; the round number is not data),
    noted in ``written`` with each run's round number there."""

    def __init__(
        self, batch_dir: str, partitions: int, written: list[tuple[str, dict[int, int]]]
    ) -> None:
        self.batch_dir, self.partitions, self.written = batch_dir, partitions, written
        self.rounds: list[tuple[dict[int, int], DataFrame]] = []
        self.rows = 0

    def add(self, rounds: dict[int, int], attempts: DataFrame, rows: int) -> DataFrame:
        """Hold a round of ``rows`` attempts (of the runs ``rounds``, at their round
        numbers); returns them as held. A round is a union of its groups' frames, so without
        the coalesce each held round would multiply its frontier's partitions by the number
        of groups (files re-read are split anew)."""
        held = attempts.coalesce(self.partitions).localCheckpoint(eager=True)
        self.rounds.append((rounds, held))
        self.rows += rows
        return held

    def write(self) -> None:
        if self.rounds:
            path = f"{self.batch_dir}/held={len(self.written):05d}"
            firsts: dict[int, int] = {}  # each run's folder is named after its first round
            for rounds, _ in self.rounds:
                for number, round_no in rounds.items():
                    firsts.setdefault(number, round_no)
            rows = union_all([attempts for _, attempts in self.rounds])
            write_by_run(rows.coalesce(self.partitions), path, sorted(firsts))
            self.written.append((path, firsts))
            # the held blocks go when the driver drops its last reference (Spark's context
            # cleaner): the frontier may still read the latest round
            self.rounds, self.rows = [], 0


# Which of the runs simulated together a row of the round engine belongs to (KeySpec.run):
# a column of its frontiers and attempts, and a folder of its batch's round files (_run=k)
RUN = "_run"


_PANDAS_TYPES = {
    field.name: {"string": "object", "bigint": "Int64", "int": "Int32", "boolean": "bool"}[
        field.dataType.simpleString()
    ]
    for field in STAGE.fields
}


def frontier_attempts(frontier: DataFrame, specs: list[KeySpec], partitions: int) -> DataFrame:
    """The rest of the deliveries of a round run's frontier, in one stage.

    For unordered consumption whose instances' pools never fill, messages do not interact, so a
    thin frontier of long retry chains is finished event by event in one stage instead of
    one Spark stage per remaining round (an always-failing HTTP message alone takes 289).
    Messages are spread over tasks by id; each task simulates its messages' chains, a
    (run, group) at a time (the frontier's :data:`RUN` column and ``specs``' keys say whose).
    The rows are hashed by group and message only, so a run's messages meet in the same
    tasks whichever runs share the stage."""
    by_key = {spec.key: spec for spec in specs}

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd  # a pandas UDF's worker has it already

        data = [batch for batch in batches if len(batch)]
        if not data:
            return
        rows = pd.concat(data, ignore_index=True)
        for (number, name), part in rows.groupby([RUN, "group"], sort=True):
            messages = part.drop_duplicates("msg_id")
            loop = simulate_key(
                by_key[(int(number), name)],
                *(messages[column] for column in ("msg_id", "queue_id", "born_ms")),
                imports=part,
                publish=False,
            )
            for batch in loop:
                frame = batch.to_pandas(types_mapper=pandas_nullable).astype(_PANDAS_TYPES)
                yield frame.assign(**{RUN: np.int32(number)})

    schema = StructType([*STAGE.fields, StructField(RUN, IntegerType(), False)])
    return frontier.repartition(partitions, "group", "msg_id").mapInPandas(run, schema)
