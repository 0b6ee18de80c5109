"""One simulation run, end to end: rounds, tables, Delta commits, and the Result for notebooks.

Everything is staged under ``<output>/_staging/<run>-<token>`` first (Parquet, invisible to
readers) under a writer lease (:mod:`retrysim.lease`), then validated
(:mod:`retrysim.validate`), and only then published table by table, each as one Delta commit
that replaces the run's partition: the ``runs`` row as ``publishing`` first, ``complete``
last, so readers see the run completely or not at all (:mod:`retrysim.recovery`). A run that
fails before publishing leaves the tables as they were; its staging folder is removed
either way.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from retrysim import __version__, views
from retrysim.capacity import peak_concurrency
from retrysim.config import Scenario, ScenarioError, scenario_json
from retrysim.engine import (
    TAIL_ROWS,
    GroupPlan,
    Progress,
    all_messages,
    group_plans,
    key_specs,
    run_rounds,
)
from retrysim.lease import acquire_lease
from retrysim.metrics import (
    compact_attempts,
    dead_letters_from_attempts,
    load_from_attempts,
    retries_by_level,
    summary_from,
    times_to_settle,
)
from retrysim.recovery import publish_run, recover
from retrysim.sequential import sequential_attempts
from retrysim.sinks import STATUS_COMPLETE, STATUS_PUBLISHING, Sink, choose_sink, remove_tree
from retrysim.tables import (
    ATTEMPTS,
    RUNS,
    SCHEMAS,
    STAGE,
    TABLE_ORDER,
    TABLE_SETS,
    data_schema,
    literal_rows,
)
from retrysim.transitions import transitions_from_attempts

T = TypeVar("T")
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def default_run_id(scenario: Scenario) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", scenario.name).strip("-") or "run"
    return f"{name}-{stamp}-{uuid.uuid4().hex[:6]}"


def check_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.match(run_id):
        raise ScenarioError(
            "--run-id",
            f"value {run_id!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit (it becomes a partition folder name)",
        )
    return run_id


@dataclass
class Result:
    """A finished run. The table properties read the run's rows back from the Delta tables."""

    spark: SparkSession
    output: str
    run_id: str
    rounds: int
    sink: str
    elapsed_s: float
    tables: str = "full"
    # the run's retries by level (metrics.retries_by_level), counted while staging, for its report
    retries: pd.DataFrame | None = field(default=None, repr=False)
    _cache: dict[str, DataFrame] = field(default_factory=dict, repr=False)

    def table(self, name: str) -> DataFrame:
        """The run's rows of ``name``; a lean run's transitions and messages are derived."""
        if name not in self._cache:
            self._cache[name] = views.table(self.spark, self.output, name, self.run_id)
        return self._cache[name]

    runs = property(lambda self: self.table("runs"))
    messages = property(lambda self: self.table("messages"))
    attempts = property(lambda self: self.table("attempts"))
    transitions = property(lambda self: self.table("transitions"))
    dead_letters = property(lambda self: self.table("dead_letters"))
    load = property(lambda self: self.table("load"))
    summary = property(lambda self: self.table("summary"))


def simulate(
    spark: SparkSession,
    scenario: Scenario,
    output: str | None = None,
    run_id: str | None = None,
    progress: Progress | None = None,
    sink: str | Sink = "auto",
    tail_rows: int = TAIL_ROWS,
    tables: str = "full",
    validate: bool = True,
) -> Result:
    """Simulate ``scenario`` and write all seven tables under ``output`` (a temp dir if None).

    ``tables="lean"`` writes attempts, dead_letters, load, summary and runs only, for very
    large runs: transitions and messages are derived when read (:mod:`retrysim.views`).

    ``tail_rows``: a round frontier of at most this many retrying messages is finished event
    by event in one stage (0: always one Spark stage per round). The staged tables are
    validated before anything is published; a broken invariant raises
    :class:`retrysim.validate.ValidationError` and leaves the tables as they were.

    >>> result = simulate(spark, load_scenario("conf/default.yaml"))  # doctest: +SKIP
    >>> result.summary.show()  # doctest: +SKIP
    """
    from retrysim.validate import check_staged

    say = progress or (lambda _line: None)
    if tables not in TABLE_SETS:
        raise ScenarioError("--tables", f"value {tables!r}: use one of {', '.join(TABLE_SETS)}")
    output = os.path.abspath(output or tempfile.mkdtemp(prefix="retrysim-"))
    run_id = check_run_id(run_id or default_run_id(scenario))
    chosen = sink if not isinstance(sink, str) else choose_sink(spark, sink)
    lease = acquire_lease(output, run_id)
    staging = lease.staging
    started_at = dt.datetime.now(dt.UTC)
    began = time.monotonic()
    try:
        recover(output, say)
        rounds, engines = _simulate_attempts(spark, scenario, staging, say, tail_rows)
        say("staging tables ...")
        written = TABLE_SETS[tables]
        staged, retries = _stage_tables(spark, scenario, staging, engines, written, say)
        rows = {
            status: _write_parquet(
                _runs_row(spark, scenario, run_id, started_at, rounds, status, tables),
                os.path.join(staging, "tables", f"runs-{status}"),
            )
            for status in (STATUS_PUBLISHING, STATUS_COMPLETE)
        }
        staged["runs"] = rows[STATUS_COMPLETE]
        if validate:
            say("validating the staged run ...")
            derived = _derived_for_lean(spark, scenario, staged)
            check_staged(spark, staged, run_id, say, derived)
        publish_run(chosen, spark, output, staged, rows[STATUS_PUBLISHING], lease)
        say(f"committed {len(written)} tables with the {chosen.name} sink")
    finally:
        lease.release()
    elapsed = time.monotonic() - began
    return Result(spark, output, run_id, rounds, chosen.name, elapsed, tables, retries)


ENGINE_ROUNDS, ENGINE_SEQUENTIAL = "rounds", "sequential"


def _simulate_attempts(
    spark: SparkSession, scenario: Scenario, staging: str, say: Progress, tail_rows: int
) -> tuple[int, dict[str, str]]:
    """Stage every group's attempts under ``staging/attempts/engine=...``: by rounds where
    that is exact, else event by event; returns the round count and each group's engine."""
    plans = group_plans(scenario)
    by_rounds = [plan for plan in plans if not plan.policy.sequential]
    rounds_dir = os.path.join(staging, "attempts", f"engine={ENGINE_ROUNDS}")
    rounds = run_rounds(spark, scenario, by_rounds, rounds_dir, say, tail_rows) if by_rounds else 0
    pools = {p.name: p.policy.pool_size for p in by_rounds if p.policy.pool_size is not None}
    full = peak_concurrency(spark.read.parquet(rounds_dir), pools) if by_rounds and pools else {}
    for name, peak in sorted(full.items()):
        say(
            f"group {name}: {peak:,} consume requests would run at once, more than its "
            f"{pools[name]:,} consumer threads; simulating it event by event"
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
    timed-out listener still holds its thread."""
    policy = plan.policy
    pool = policy.pool_size
    return (
        policy.blocking
        and policy.batch_size == 1
        and policy.replay is None
        and (pool is None or (policy.timeout_ms is None and pool >= plan.group.workload.queues))
    )


def _write_parquet(df: DataFrame, path: str) -> str:
    df.write.parquet(path)
    return path


def _stage_tables(
    spark: SparkSession,
    scenario: Scenario,
    staging: str,
    engines: dict[str, str],
    written: tuple[str, ...] = TABLE_ORDER,
    say: Progress = lambda _line: None,
) -> tuple[dict[str, str], pd.DataFrame]:
    """Compute the ``written`` tables but ``runs`` into Parquet under ``staging/tables``;
    later tables read earlier ones back so no plan is computed twice. Returns their folders
    and the run's retries by level (for its report, counted from the compacted attempts).

    The tables and scans that do not need each other run at once, from threads: each is a
    job of a few big tasks, and a core left idle by one job's last task takes the next job's
    (Spark's FIFO scheduler runs the first job's tasks first; a fair scheduler pool per
    thread was measured and ends at the same time). Says how long each took (the times
    overlap): on a large run staging is minutes, and the split shows where they go."""
    tables = os.path.join(staging, "tables")
    path = {name: os.path.join(tables, name) for name in SCHEMAS}
    began = time.monotonic()
    files = _stage_attempts(os.path.join(staging, "attempts"), path["attempts"])
    say(f"  staged attempts ({files} round files, as written)")
    attempts = spark.read.schema(data_schema(ATTEMPTS)).parquet(path["attempts"])

    def stage(name: str, build: Callable[[], DataFrame]) -> None:
        began = time.monotonic()
        _write_parquet(build(), path[name])
        say(f"  staged {name} ({time.monotonic() - began:.1f}s)")

    def load_and_summary() -> pd.DataFrame:
        began = time.monotonic()
        # two scans of every attempt that need nothing else: at once
        compact, times = run_together(
            [lambda: compact_attempts(attempts, scenario), lambda: times_to_settle(attempts)]
        )
        say(f"  compacted the attempts for load and summary ({time.monotonic() - began:.1f}s)")
        stage("load", lambda: load_from_attempts(spark, attempts, scenario, compact).coalesce(1))
        load = spark.read.parquet(path["load"])
        summary = summary_from(spark, attempts, load, scenario, engines, compact, times)
        stage("summary", lambda: summary.coalesce(1))
        return retries_by_level(attempts, compact)

    work = [
        load_and_summary,
        lambda: stage("dead_letters", lambda: dead_letters_from_attempts(attempts, scenario)),
    ]
    if "messages" in written:
        work.insert(0, lambda: stage("messages", lambda: all_messages(spark, scenario)))
    if "transitions" in written:
        work.insert(0, lambda: stage("transitions", lambda: transitions_from_attempts(attempts)))
    retries = run_together(work)[work.index(load_and_summary)]
    say(f"  staged {len(written) - 1} tables ({time.monotonic() - began:.1f}s)")
    return {name: folder for name, folder in path.items() if name in written}, retries


def run_together(work: list[Callable[[], T]]) -> list[T]:
    """Run ``work`` in threads, each submitting its own Spark jobs, and wait for all of
    them; return their results, or re-raise the first failure (in ``work``'s order) once
    every one has stopped, so nothing is still writing when the caller cleans up."""
    with ThreadPoolExecutor(max_workers=len(work), thread_name_prefix="retrysim-stage") as pool:
        futures = [pool.submit(task) for task in work]
        wait(futures)
    return [future.result() for future in futures]


def _stage_attempts(rounds: str, table: str) -> int:
    """Move the round files (``rounds/engine=*/round=*/*.parquet``, every row in force) into
    the staged attempts table: they are its files already (STAGE is the table's data columns),
    so the biggest table is not rewritten. Returns the number of files."""
    os.makedirs(table)
    files = sorted(Path(rounds).glob("engine=*/round=*/*.parquet"))
    for file in files:
        engine, round_no = (part.split("=", 1)[1] for part in file.parts[-3:-1])
        os.replace(file, os.path.join(table, f"{engine}-{round_no}-{file.name}"))
    return len(files)


def _derived_for_lean(
    spark: SparkSession, scenario: Scenario, staged: dict[str, str]
) -> dict[str, DataFrame]:
    """The staged data tables a lean run does not write, derived, so that validation checks
    them as readers will see them (data columns only, like the staged Parquet)."""
    derived: dict[str, DataFrame] = {}
    if "transitions" not in staged:
        staged_attempts = spark.read.schema(data_schema(ATTEMPTS)).parquet(staged["attempts"])
        derived["transitions"] = transitions_from_attempts(staged_attempts)
    if "messages" not in staged:
        derived["messages"] = all_messages(spark, scenario)
    return derived


def _runs_row(
    spark: SparkSession,
    scenario: Scenario,
    run_id: str,
    started_at: dt.datetime,
    rounds: int,
    status: str = STATUS_COMPLETE,
    tables: str = "full",
) -> DataFrame:
    row = (
        scenario.name,
        scenario.seed,
        scenario_json(scenario),
        started_at,
        dt.datetime.now(dt.UTC),
        __version__,
        spark.sparkContext.master,
        status,
        rounds,
        tables,
    )
    return literal_rows(spark, [row], data_schema(RUNS))
