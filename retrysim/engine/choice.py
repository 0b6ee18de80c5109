"""Which engine simulates each group, and running them: rounds where exact, else event by event.

The round engine (one Spark stage per delivery round) is exact while no consumer pool fills
up and dispatch order does not matter. Ordered queues and batches need the sequential engine
from the start; a pool that the rounds show would have filled is dropped from the round
files and simulated again event by event.
"""

from __future__ import annotations

import os
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from retrysim.engine.capacity import peak_concurrency
from retrysim.engine.rounds import (
    GroupPlan,
    Progress,
    all_messages,
    group_plans,
    key_specs,
    run_rounds,
)
from retrysim.engine.sequential import sequential_attempts
from retrysim.scenario.spec import Scenario
from retrysim.store.sinks import remove_tree
from retrysim.tables.schemas import STAGE

ENGINE_ROUNDS, ENGINE_SEQUENTIAL = "rounds", "sequential"


def simulate_attempts(
    spark: SparkSession, scenario: Scenario, staging: str, say: Progress, tail_rows: int
) -> tuple[int, dict[str, str]]:
    """Stage every group's attempts under ``staging/attempts/engine=...``: by rounds where
    that is exact, else event by event; returns the round count and each group's engine."""
    plans = group_plans(scenario)
    by_rounds = [plan for plan in plans if not plan.policy.sequential]
    rounds_dir = os.path.join(staging, "attempts", f"engine={ENGINE_ROUNDS}")
    rounds = run_rounds(spark, scenario, by_rounds, rounds_dir, say, tail_rows) if by_rounds else 0
    threads = {p.name: p.policy.topology.threads for p in by_rounds}
    pools = {name: count for name, count in threads.items() if count is not None}
    full = peak_concurrency(spark.read.parquet(rounds_dir), pools) if by_rounds and pools else {}
    for name, peak in sorted(full.items()):
        say(
            f"group {name}: {peak:,} consume requests would run at once on one instance, more "
            f"than its {pools[name]:,} threads; simulating it event by event"
        )
    if full:
        _drop_groups(spark, rounds_dir, set(full))
    sequential = [plan for plan in plans if plan.policy.sequential or plan.name in full]
    if sequential:
        _run_sequential(spark, scenario, sequential, staging, say)
    engines = {p.name: ENGINE_SEQUENTIAL if p in sequential else ENGINE_ROUNDS for p in plans}
    return rounds, engines


def _drop_groups(spark: SparkSession, folder: str, groups: set[str]) -> None:
    """Remove the rows of ``groups`` from the round files in ``folder`` (those groups are
    simulated again event by event), so that every staged attempt row is in force and the
    files are published as they are (:func:`_stage_attempts`). Rare: a full pool."""
    kept = f"{folder}-kept"
    rows = spark.read.parquet(folder).select(*STAGE.fieldNames())
    rows.where(~F.col("group").isin(*sorted(groups))).write.parquet(f"{kept}/round=00001")
    remove_tree(folder)
    os.replace(kept, folder)


def _run_sequential(
    spark: SparkSession, scenario: Scenario, plans: list[GroupPlan], staging: str, say: Progress
) -> None:
    specs = key_specs(scenario, plans)
    per_lane = {plan.name for plan in plans if lanes_are_independent(plan)}
    keys = sum(p.group.workload.queues if p.name in per_lane else 1 for p in plans)
    say(
        f"event-by-event simulation of {', '.join(p.name for p in plans)} "
        f"({keys:,} independent {'keys' if keys > 1 else 'key'}) ..."
    )
    began = time.monotonic()
    messages = all_messages(spark, scenario, [plan.group for plan in plans])
    partitions = max(spark.sparkContext.defaultParallelism, min(keys, 200))
    path = os.path.join(staging, "attempts", f"engine={ENGINE_SEQUENTIAL}", "round=00000")
    # up to 200 partitions balance the keys; their files are the attempts table's, so they
    # are written as one file per core (each task runs its partitions' keys in turn)
    attempts = sequential_attempts(messages, specs, per_lane, partitions)
    attempts.coalesce(spark.sparkContext.defaultParallelism).write.parquet(path)
    count = spark.read.parquet(path).where(F.col("start_ms").isNotNull()).count()
    say(f"event-by-event: {count:,} deliveries, {time.monotonic() - began:.1f}s")


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
        and (
            threads is None
            or (policy.timeout_ms is None and threads >= policy.topology.most_lanes_per_instance)
        )
    )
