"""The round engine: one Spark stage per delivery round over the frontier.

Round k holds every message's k-th delivery. Its stage draws the listener result, applies
the flavor's timeout and retry rules, and writes the round's attempts as Parquet in the
attempts table's columns (they are published as the table's files, not rewritten); the
next frontier is re-read from those files (WaitingRetry rows due before the horizon), so
lineage never grows across rounds and the driver only ever sees counts. A thin frontier's
rounds are held in executor memory instead and written together (:data:`THIN_ROWS`).

This is exact when deliveries of a group do not interact: unordered consumption with a
consumer pool that is never full (every Ready delivery starts when it is eligible). Ordered
queues, batches and full pools are handled by :mod:`retrysim.engine.sequential`; the runner checks
a finished round run against the pool size (:mod:`retrysim.engine.capacity`) and re-runs a group
sequentially when its pool would have been full.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F

from retrysim.engine.sequential import KeySpec, frontier_attempts
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
from retrysim.model.workload import messages_df
from retrysim.scenario.spec import Group, Scenario
from retrysim.tables.schemas import STAGE, schema_columns

Progress = Callable[[str], None]

# A frontier this thin is finished event by event in one stage (sequential.frontier_attempts)
# rather than one Spark stage per remaining round: a round has a fixed cost however small its
# frontier, and a thin frontier is mostly poison messages that stay for every round (an
# always-failing HTTP message alone takes 289 rounds), so the event loop wins below a few
# thousand messages and loses well above (docs/performance.md).
TAIL_ROWS = 5_000
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
_AFTER_READY = tuple(f.name for f in STAGE.fields if f.name not in (*FRONTIER_COLUMNS, ASSIGNED))
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


def all_messages(spark: SparkSession, scenario: Scenario, groups: list[Group] | None = None):
    """Every group's messages, one DataFrame (``messages`` table shape, no run_id)."""
    chosen = groups if groups is not None else list(scenario.groups)
    return union_all([messages_df(spark, group, scenario.seed) for group in chosen])


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


def horizon_cut_columns(horizon_ms: int) -> dict[str, Column]:
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


class Round:
    """A round of every group as column expressions, built once per run and applied to each
    frontier (:meth:`attempts`): building them takes thousands of calls into the JVM, applying
    them a dozen."""

    def __init__(self, plans: list[GroupPlan], seed: int, horizon_ms: int) -> None:
        self.groups: list[tuple[Column, list[dict[str, Column]], list[str]]] = []
        for plan in plans:
            policy = plan.policy
            draws = listener_draw_columns(plan.group.behavior, seed, plan.name)
            cases, steps = policy.next_step_columns()
            projections = [
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
            self.groups.append((F.col("group") == F.lit(plan.name), projections, list(cases)))
        self.stage = schema_columns(STAGE)

    def attempts(self, frontier: DataFrame) -> DataFrame:
        """One round: each frontier row becomes one staged attempt row."""
        frames = []
        for rows_of_group, projections, helpers in self.groups:
            frame = frontier.where(rows_of_group)
            for columns in projections:
                frame = frame.withColumns(columns)
            frames.append(frame.drop(*helpers))
        return union_all(frames).select(*self.stage)


def retries_due(horizon_ms: int) -> Column:
    """Whether an attempt row leads to another delivery: WaitingRetry (or, 5.x simple,
    Inflight until visible again), due before the horizon."""
    return F.col("next_topic").isNotNull() & (F.col("next_ready_ms") < F.lit(horizon_ms))


def next_frontier(attempts: DataFrame, horizon_ms: int) -> DataFrame:
    """The deliveries that WaitingRetry rows lead to, when due before the horizon."""
    counted, kept = next_reconsume_columns(
        F.col("reconsume_times"), F.col("broker_reconsume_times"), F.col("end_reason")
    )
    return attempts.where(retries_due(horizon_ms)).select(
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


def run_rounds(
    spark: SparkSession,
    scenario: Scenario,
    plans: list[GroupPlan],
    staging_dir: str,
    progress: Progress = lambda _line: None,
    tail_rows: int = TAIL_ROWS,
) -> int:
    """Run every round for ``plans``, staging attempts under ``staging_dir/round=k``, until
    no delivery is left or the frontier is thin enough to finish event by event; then the
    replay rounds, if any group replays its dead letters. Returns the number of rounds.

    The driver sees only two counts per round, and the sizes of a round's files.
    """
    messages = all_messages(spark, scenario, [plan.group for plan in plans])
    frontier = first_frontier(messages, scenario.horizon).select(*FRONTIER_COLUMNS)
    specs = key_specs(scenario, plans)
    partitions = spark.sparkContext.defaultParallelism
    open_cost = open_cost_bytes(spark)
    split = None  # the split size for the next round's frontier, if not Spark's own
    started = time.monotonic()
    round_no, replayed = 0, False
    held = _HeldRounds(staging_dir, partitions)
    round_ = Round(plans, scenario.seed, scenario.horizon)
    thin, frontier_rows = False, 0  # the first frontier is every message: never thin
    counted = (
        F.count(F.col("start_ms")).alias("started"),
        F.sum(retries_due(scenario.horizon).cast("long")).alias("retrying"),
    )
    while True:
        round_no += 1
        # counted while written or held: no second pass over the round's rows
        observed = Observation()
        attempts = round_.attempts(frontier).observe(observed, *counted)
        with conf_set(spark, frontier_read(split) if split else {}):  # read when planned
            if thin:
                staged, split = held.add(round_no, attempts, frontier_rows), None
            else:
                path = f"{staging_dir}/round={round_no:05d}"
                attempts.write.parquet(path)
                split = frontier_split_bytes(parquet_file_sizes(path), partitions, open_cost)
                staged = spark.read.parquet(path)
        counts = observed.get
        retrying = counts["retrying"] or 0
        progress(
            f"round {round_no}{' (replay)' if replayed else ''}: {counts['started']:,} "
            f"deliveries, {retrying:,} to retry, {time.monotonic() - started:.1f}s elapsed"
            f"{' (in memory)' if thin else ''}"
        )
        frontier = next_frontier(staged, scenario.horizon)
        thin, frontier_rows = retrying <= THIN_ROWS, retrying
        if held.rows >= HELD_ROWS:
            held.write()
        if 0 < retrying <= tail_rows:
            round_no += 1
            tail = f"{staging_dir}/round={round_no:05d}"
            frontier_attempts(frontier, specs, partitions).write.parquet(tail)
            finished = spark.read.parquet(tail).where(F.col("start_ms").isNotNull()).count()
            progress(
                f"rounds {round_no}+: {retrying:,} messages still retrying, finished event by "
                f"event: {finished:,} deliveries, {time.monotonic() - started:.1f}s elapsed"
            )
            retrying = 0
        if retrying == 0:
            held.write()
            if replayed:
                return round_no
            replayed, thin = True, False
            frontier = replay_frontier(spark.read.parquet(staging_dir), plans, scenario.horizon)
            if frontier is None or frontier.isEmpty():
                return round_no


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
    """The sizes of the Parquet files in a local ``folder`` (none for other file systems)."""
    if not os.path.isdir(folder):
        return []
    return [entry.stat().st_size for entry in os.scandir(folder) if entry.name.endswith(".parquet")]


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
    as one folder (named after the first of them; the round number is not data)."""

    def __init__(self, staging_dir: str, partitions: int) -> None:
        self.staging_dir, self.partitions = staging_dir, partitions
        self.rounds: list[tuple[int, DataFrame]] = []
        self.rows = 0

    def add(self, round_no: int, attempts: DataFrame, rows: int) -> DataFrame:
        """Hold a round of ``rows`` attempts; returns them as held. A round is a union of
        its groups' frames, so without the coalesce each held round would multiply its
        frontier's partitions by the number of groups (files re-read are split anew)."""
        held = attempts.coalesce(self.partitions).localCheckpoint(eager=True)
        self.rounds.append((round_no, held))
        self.rows += rows
        return held

    def write(self) -> None:
        if self.rounds:
            first = self.rounds[0][0]
            rows = union_all([attempts for _, attempts in self.rounds])
            rows.coalesce(self.partitions).write.parquet(f"{self.staging_dir}/round={first:05d}")
            # the held blocks go when the driver drops its last reference (Spark's context
            # cleaner): the frontier may still read the latest round
            self.rounds, self.rows = [], 0
