"""Which engine simulates each group: rounds where exact, else event by event; and the
order they run in (:mod:`retrysim.engine.rounds`, :mod:`retrysim.engine.event_stage`).

The round engine (one Spark stage per delivery round) is exact while no consumer pool fills
up and dispatch order does not matter. Ordered queues and batches need the sequential engine
from the start, and so does a pool the scenario alone shows full
(:func:`retrysim.engine.capacity.offered_load`); a pool that the rounds show would have filled
is dropped from the round files and simulated again event by event.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from retrysim.engine.capacity import CERTAINLY_FULL, offered_load, peak_concurrency
from retrysim.engine.event_stage import (
    ENGINE_SEQUENTIAL,
    MOST_OUTPUT_PARTS,
    EventRun,
    in_units,
    per_lane_groups,
    run_events,
)
from retrysim.engine.rounds import (
    ENGINE_ROUNDS,
    GroupPlan,
    RoundRun,
    group_plans,
    key_specs,
    run_rounds,
)
from retrysim.model.behavior import longest_processing_ms
from retrysim.progress import Progress
from retrysim.scenario.spec import Scenario
from retrysim.session import full_jit
from retrysim.tables.group_sums import GroupSums
from retrysim.tables.schemas import STAGE

# A group on a finite pool with at most this many messages is simulated event by event from
# the start: no round run is thrown away when its pool turns out full, and where the pool
# never fills both engines are exact and give the same rows. On a small machine the
# compiled stage simulates such a group in less time than the round run and the check that
# finds its pool full take (docs/performance.md); a cluster with many cores runs rounds
# wider than this stage's few tasks, hence a bound. 0: rounds first always.
SMALL_GROUP_MESSAGES = 5_000_000
# A group simulated event by event whose instances are independent units (docs/model.md §5,
# "Units") runs as its units from this many messages, when it has more units than a whole
# group's tasks (MOST_OUTPUT_PARTS) and the cores to run them. A unit cannot sum up the
# group's peaks, so staging scans its rows again in Spark: on a small machine units gain
# nothing in the stage and lose much in staging (docs/performance.md). The compiled loop is
# cheap next to Spark's work on its rows, so units can pay only where a large group would
# otherwise leave many cores idle while a few simulate it (not measured on a cluster yet).
UNIT_MESSAGES = 5_000_000


def simulate_attempts(
    spark: SparkSession,
    scenario: Scenario,
    staging: str,
    say: Progress,
    tail_rows: int,
    small_group: int = SMALL_GROUP_MESSAGES,
    unit_messages: int | None = None,
    task_tables: tuple[str, ...] = (),
) -> tuple[int, dict[str, str], dict[str, GroupSums]]:
    """Stage every group's attempts under ``staging/attempts/engine=...``: by rounds where
    that is exact, else event by event; returns the round count, each group's engine and
    the sums of the groups simulated whole in one task (for staging). A group on a finite
    pool with at most ``small_group`` messages runs event by event from the start; one
    simulated event by event in units (:func:`units_of`) with at least ``unit_messages``
    runs as its units (None: from :data:`UNIT_MESSAGES`, with more first-step units than
    :data:`MOST_OUTPUT_PARTS` on more cores than that, else never). When every group is
    simulated whole in a task, those tasks also write the tables ``task_tables`` of
    :data:`retrysim.tables.message_tables.TASK_TABLES` (dead letters only where nothing is
    replayed) under ``staging/task_tables``, for staging to take as they are. The one-run
    case of :func:`simulate_runs_attempts`."""
    return simulate_runs_attempts(
        spark, [(scenario, staging)], say, tail_rows, small_group, unit_messages, task_tables
    )[0]


@dataclass
class _Choice:
    """A run of a batch and its groups' engines, as chosen before and after its rounds."""

    scenario: Scenario
    staging: str
    plans: list[GroupPlan]
    from_start: set[str]  # simulated event by event from the start (_from_start)
    full: set[str]  # by rounds first, whose pools the rounds showed full

    @property
    def by_rounds(self) -> list[GroupPlan]:
        return [p for p in self.plans if not needs_events(p) and p.name not in self.from_start]

    @property
    def by_events(self) -> list[GroupPlan]:
        return [p for p in self.plans if needs_events(p) or p.name in self.from_start | self.full]

    @property
    def rounds_dir(self) -> str:
        return os.path.join(self.staging, "attempts", f"engine={ENGINE_ROUNDS}")


def simulate_runs_attempts(
    spark: SparkSession,
    runs: list[tuple[Scenario, str]],
    say: Progress,
    tail_rows: int,
    small_group: int = SMALL_GROUP_MESSAGES,
    unit_messages: int | None = None,
    task_tables: tuple[str, ...] = (),
) -> list[tuple[int, dict[str, str], dict[str, GroupSums]]]:
    """:func:`simulate_attempts` for several runs (scenario, staging folder): a plan's points
    and replications, simulated side by side so that a cluster runs them at once and a small
    machine pays each stage's start once. The groups for the round engine of every run go
    through one Spark stage a round (:func:`run_rounds`); then, once each run's pools are
    checked, the groups simulated event by event of every run not in units share one Spark
    stage, each key a task of it, each run's rows written to its own staging. A run with a
    group in units has its event-by-event stage to itself. Each run's rows and files are
    those it gets alone."""
    most, fewest_units = _unit_rule(spark, unit_messages)
    several = len(runs) > 1
    quiet: Progress = lambda _line: None  # noqa: E731 (each run's choices would repeat)
    choices = []
    for scenario, staging in runs:
        plans = group_plans(scenario)
        from_start = _from_start(plans, small_group, quiet if several else say)
        choices.append(_Choice(scenario, staging, plans, from_start, set()))
    rounds = _run_rounds(spark, choices, say, tail_rows)
    together: dict[int, EventRun] = {}
    alone: dict[int, EventRun] = {}
    for number, choice in enumerate(choices):
        if not choice.by_events:
            continue
        run = EventRun(choice.scenario, choice.by_events, choice.staging)
        specs = key_specs(run.scenario, run.plans)
        units = in_units(specs, per_lane_groups(specs, run.plans), most, fewest_units)
        (alone if units else together)[number] = run
    sums: dict[int, dict[str, GroupSums]] = {}
    if together:
        if several:
            say(f"{len(together)} of {len(runs)} runs simulated event by event together ...")
        found = run_events(spark, list(together.values()), say, sys.maxsize, 1, task_tables)
        sums.update(zip(together, found, strict=True))
    for number, run in alone.items():
        if several:
            say(f"run {number + 1} of {len(runs)} event by event on its own (in units) ...")
        sums[number] = run_events(
            spark, [run], say, most, fewest_units, task_tables
        )[0]  # fmt: skip
    results = []
    for number, choice in enumerate(choices):
        sequential = {plan.name for plan in choice.by_events}
        engines = {
            plan.name: ENGINE_SEQUENTIAL if plan.name in sequential else ENGINE_ROUNDS
            for plan in choice.plans
        }
        results.append((rounds.get(number, 0), engines, sums.get(number, {})))
    return results


def _run_rounds(
    spark: SparkSession, choices: list[_Choice], say: Progress, tail_rows: int
) -> dict[int, int]:
    """Every run's groups for the round engine, one Spark stage a round for all the runs
    (:func:`run_rounds`); then each run's pools checked (:func:`peak_concurrency`) and the
    groups found full dropped from its round files, noted in its ``full``. Returns each
    run's round count, for the runs with rounds."""
    numbers = [number for number, choice in enumerate(choices) if choice.by_rounds]
    if not numbers:
        return {}
    several = len(choices) > 1
    if several:
        say(f"{len(numbers)} of {len(choices)} runs by rounds together ...")
    full_jit(spark)  # Spark's generated code runs every round's rows
    batch = [RoundRun(choices[n].scenario, choices[n].by_rounds, choices[n].rounds_dir)
             for n in numbers]  # fmt: skip
    folder = os.path.join(choices[numbers[0]].staging, "rounds-batch")
    counts = run_rounds(spark, batch, folder, say, tail_rows)
    for number in numbers:
        choice = choices[number]
        threads = {p.name: p.policy.topology.threads for p in choice.by_rounds}
        pools = {name: count for name, count in threads.items() if count is not None}
        if not pools:
            continue
        whose = f"run {number + 1}: " if several else ""
        say(f"{whose}checking the consumer pools of {', '.join(sorted(pools))} ...")
        full = peak_concurrency(spark.read.parquet(choice.rounds_dir), pools)
        for name, peak in sorted(full.items()):
            say(
                f"{whose}group {name}: {peak:,} consume requests would run at once on one "
                f"instance, more than its {pools[name]:,} threads; simulating it event by event"
            )
        if full:
            _drop_groups(spark, choice.rounds_dir, set(full))
        choice.full = set(full)
    return dict(zip(numbers, counts, strict=True))


def _unit_rule(spark: SparkSession, unit_messages: int | None) -> tuple[int, int]:
    """From how many messages, and units, a group runs as its units: as given, or (None)
    only where units give more tasks than a whole group's parts (:data:`UNIT_MESSAGES`)."""
    if unit_messages is not None:
        return unit_messages, 1
    wide = spark.sparkContext.defaultParallelism > MOST_OUTPUT_PARTS
    return (UNIT_MESSAGES if wide else sys.maxsize), MOST_OUTPUT_PARTS + 1


def _from_start(plans: list[GroupPlan], small_group: int, say: Progress) -> set[str]:
    """The groups simulated event by event from the start: those that need it
    (:func:`needs_events`), those whose pools the scenario shows full, and small ones."""
    for plan in plans:
        if plan.group.behavior.downstream is not None:
            say(
                f"group {plan.name}: its downstream answers to load (each call depends on the "
                "calls in flight); simulating it event by event"
            )
    by_rounds = [plan for plan in plans if not needs_events(plan)]
    full_from_start = _certainly_full(by_rounds, say)
    not_full = [plan for plan in by_rounds if plan.name not in full_from_start]
    return (
        {plan.name for plan in plans if needs_events(plan)}
        | full_from_start
        | _small(not_full, small_group, say)
    )


def planned_engines(scenario: Scenario, say: Progress) -> dict[str, str]:
    """Each group's engine as a run chooses it before it starts (``say`` gets the reasons
    a run prints): :data:`ENGINE_SEQUENTIAL` from the start, else :data:`ENGINE_ROUNDS`
    (which a pool the rounds show full still sends event by event). What ``--dry-run``
    prints; the run itself decides through :func:`_from_start`, the same rule."""
    plans = group_plans(scenario)
    from_start = _from_start(plans, SMALL_GROUP_MESSAGES, say)
    return {
        plan.name: ENGINE_SEQUENTIAL if plan.name in from_start else ENGINE_ROUNDS for plan in plans
    }


def needs_events(plan: GroupPlan) -> bool:
    """Whether a group is simulated event by event from the start, whatever its pool:
    ordered queues and batches are decided by dispatch order, so is a 4.x cleaner's run that
    may find more expired than it sends back, and a downstream that answers to load makes
    each call depend on the calls in flight (the round engine declines both); a 4.9 client
    that may send a delivery back twice numbers its copies' deliveries as they start."""
    behavior = plan.group.behavior
    longest = longest_processing_ms(behavior)
    return (
        plan.policy.sequential
        or behavior.downstream is not None
        or plan.policy.cleaner_may_fill(longest)
        or plan.policy.may_send_back_twice(longest)
    )


def _certainly_full(plans: list[GroupPlan], say: Progress) -> set[str]:
    """The groups whose pools the scenario alone shows full (:func:`offered_load`)."""
    full = set()
    for plan in plans:
        topology = plan.policy.topology
        load = offered_load(plan.group, topology)
        if load is not None and load >= CERTAINLY_FULL:
            full.add(plan.name)
            say(
                f"group {plan.name}: its busiest instance is offered {load:.1f} x its "
                f"{topology.threads:,} threads by first deliveries alone; simulating it event "
                "by event from the start"
            )
    return full


def _small(plans: list[GroupPlan], most: int, say: Progress) -> set[str]:
    """The groups on finite pools small enough to simulate event by event at once
    (:data:`SMALL_GROUP_MESSAGES`)."""
    small = set()
    for plan in plans:
        messages = plan.group.workload.messages
        finite = plan.policy.topology.threads is not None
        if finite and messages <= most:
            small.add(plan.name)
            say(
                f"group {plan.name}: {messages:,} messages on a pool of "
                f"{plan.policy.topology.threads:,} threads per instance; simulating it event by "
                "event from the start (exact whether or not the pool fills)"
            )
    return small


def _drop_groups(spark: SparkSession, folder: str, groups: set[str]) -> None:
    """Remove the rows of ``groups`` from the round files in ``folder`` (those groups are
    simulated again event by event), so that every staged attempt row is in force and the
    files are published as they are (:func:`_stage_attempts`). Rare: a full pool."""
    kept = f"{folder}-kept"
    rows = spark.read.parquet(folder).select(*STAGE.fieldNames())
    rows.where(~F.col("group").isin(*sorted(groups))).write.parquet(f"{kept}/round=00001")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(kept, folder)
