"""The iterative engine: one Spark stage per delivery round over the frontier.

Round k holds every message's k-th delivery. Its stage draws the listener outcome and
processing time, applies the consume-timeout rule and the retry policy, and writes the
attempts as Parquet into the run's staging area; the next frontier is re-read from those
files (WaitingRetry rows due before the horizon), so lineage never grows across rounds and
the driver only ever sees counts. Capacity is unlimited for now: a Ready message starts at
once (start = ready); finite consumers come with the capacity model.

A delivery that starts before the horizon but would end at or after it is recorded as
Inflight with no outcome; a retry due at or after the horizon is not delivered. Such
messages are "pending at horizon".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from retrysim.behavior import with_listener_draws
from retrysim.config import Group, Scenario
from retrysim.policy import INFLIGHT, WAITING_RETRY, Concurrently4, policy_for
from retrysim.workload import messages_df

Progress = Callable[[str], None]

# Staged attempt rows: the attempts table plus what later stages need (born_ms for times
# to commit, and the end transition's topic, queue and reason).
STAGE_COLUMNS = (
    "group",
    "msg_id",
    "delivery",
    "reconsume_times",
    "source_topic",
    "queue_id",
    "born_ms",
    "ready_ms",
    "start_ms",
    "processing_ms",
    "end_ms",
    "outcome",
    "result_state",
    "delay_level",
    "next_ready_ms",
    "reason",
    "to_topic",
    "to_queue_id",
)
_CUT_BY_HORIZON = (
    "outcome",
    "end_ms",
    "delay_level",
    "next_ready_ms",
    "reason",
    "to_topic",
    "to_queue_id",
)


@dataclass(frozen=True)
class GroupPlan:
    """A group's validated config with its policy object."""

    group: Group
    policy: Concurrently4


def group_plans(scenario: Scenario) -> list[GroupPlan]:
    table = scenario.broker.message_delay_level
    return [GroupPlan(group, policy_for(group, table)) for group in scenario.groups]


def all_messages(spark: SparkSession, scenario: Scenario) -> DataFrame:
    """Every group's messages, one DataFrame (``messages`` table shape, no run_id)."""
    frames = [messages_df(spark, group, scenario.seed) for group in scenario.groups]
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
        F.col("topic").alias("source_topic"),
        "queue_id",
        "born_ms",
        F.col("born_ms").alias("ready_ms"),
    )


def with_horizon_cut(df: DataFrame, horizon_ms: int) -> DataFrame:
    """A delivery still running at the horizon stays Inflight with no known outcome."""
    cut = F.col("end_ms") >= F.lit(horizon_ms)
    for name in _CUT_BY_HORIZON:
        df = df.withColumn(name, F.when(~cut, F.col(name)))
    return df.withColumn(
        "result_state", F.when(cut, F.lit(INFLIGHT)).otherwise(F.col("result_state"))
    )


def attempts_of_round(
    frontier: DataFrame, plans: list[GroupPlan], seed: int, horizon_ms: int
) -> DataFrame:
    """One round: each frontier row becomes one staged attempt row."""
    frames = []
    for plan in plans:
        frames.append(
            frontier.where(F.col("group") == F.lit(plan.group.name))
            .withColumn("start_ms", F.col("ready_ms"))
            .transform(with_listener_draws, plan.group.behavior, seed, plan.group.name)
            .transform(plan.policy.with_consume_result)
            .transform(plan.policy.with_next_step)
            .transform(with_horizon_cut, horizon_ms)
        )
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result.select(*STAGE_COLUMNS)


def next_frontier(attempts: DataFrame, plans: list[GroupPlan], horizon_ms: int) -> DataFrame:
    """The deliveries that the previous round's WaitingRetry rows lead to, before the horizon."""
    topic = F.lit(None).cast("string")
    queue = F.lit(None).cast("int")
    for plan in plans:
        is_group = F.col("group") == F.lit(plan.group.name)
        topic = F.when(is_group, F.lit(plan.policy.retry_topic)).otherwise(topic)
        queue = F.when(is_group, F.lit(0)).otherwise(queue)
    return attempts.where(
        (F.col("result_state") == F.lit(WAITING_RETRY))
        & (F.col("next_ready_ms") < F.lit(horizon_ms))
    ).select(
        "group",
        "msg_id",
        (F.col("delivery") + 1).alias("delivery"),
        (F.col("reconsume_times") + 1).alias("reconsume_times"),
        topic.alias("source_topic"),
        queue.alias("queue_id"),
        "born_ms",
        F.col("next_ready_ms").alias("ready_ms"),
    )


def run_rounds(
    spark: SparkSession,
    scenario: Scenario,
    staging_dir: str,
    progress: Progress = lambda _line: None,
    max_rounds: int = 100_000,
) -> int:
    """Run every round, staging attempts under ``staging_dir/round=k``; returns the round count.

    Each round is written before the next starts; the driver reads back two counts per round.
    """
    plans = group_plans(scenario)
    frontier = first_frontier(all_messages(spark, scenario), scenario.horizon)
    started = time.monotonic()
    for round_no in range(1, max_rounds + 1):
        path = f"{staging_dir}/round={round_no:05d}"
        attempts_of_round(frontier, plans, scenario.seed, scenario.horizon).write.parquet(path)
        staged = spark.read.parquet(path)
        frontier = next_frontier(staged, plans, scenario.horizon)
        counts = staged.agg(
            F.count(F.lit(1)).alias("deliveries"),
            F.sum(
                (
                    (F.col("result_state") == F.lit(WAITING_RETRY))
                    & (F.col("next_ready_ms") < F.lit(scenario.horizon))
                ).cast("long")
            ).alias("retrying"),
        ).first()
        deliveries, retrying = counts["deliveries"], counts["retrying"] or 0
        progress(
            f"round {round_no}: {deliveries:,} deliveries, {retrying:,} to retry, "
            f"{time.monotonic() - started:.1f}s elapsed"
        )
        if retrying == 0:
            return round_no
    raise RuntimeError(f"more than {max_rounds} rounds; the scenario does not converge")
