"""Staging a run's tables: Parquet under ``<staging>/tables``, invisible until published.

Later tables read earlier ones back so no plan is computed twice, and the tables that do
not need each other are written at once from threads (:func:`run_together`).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from retrysim.model.workload import all_messages
from retrysim.progress import Progress
from retrysim.scenario.loading import scenario_json
from retrysim.scenario.spec import Scenario
from retrysim.store.sinks import STATUS_COMPLETE
from retrysim.tables.dead_letters import dead_letters_from_attempts
from retrysim.tables.group_sums import GroupSums
from retrysim.tables.instances import changes_of_shared_groups, instance_load_from
from retrysim.tables.load import compact_attempts, load_from_attempts, retries_by_level
from retrysim.tables.message_tables import TASK_TABLES_DIR
from retrysim.tables.peaks import bucket_changes
from retrysim.tables.schemas import (
    ATTEMPTS,
    SCHEMAS,
    TABLE_ORDER,
    data_schema,
    without_comments,
)
from retrysim.tables.summary import summary_from, times_to_settle
from retrysim.tables.summed_tables import small_tables
from retrysim.tables.transitions import transitions_from_attempts
from retrysim.version import __version__

T = TypeVar("T")


def write_parquet(df: DataFrame, path: str) -> str:
    df.write.parquet(path)
    return path


def stage_tables(
    spark: SparkSession,
    scenario: Scenario,
    staging: str,
    engines: dict[str, str],
    written: tuple[str, ...] = TABLE_ORDER,
    say: Progress = lambda _line: None,
    known: dict[str, GroupSums] | None = None,
) -> tuple[dict[str, str], pd.DataFrame]:
    """Compute the ``written`` tables but ``runs`` into Parquet under ``staging/tables``;
    later tables read earlier ones back so no plan is computed twice. Returns their folders
    and the run's retries by level (for its report, counted from the compacted attempts).
    ``known``: the peaks and settle times of groups summed up where they were simulated
    (:mod:`retrysim.tables.key_peaks`), whose attempts those passes do not read again.

    The tables and scans that do not need each other run at once, from threads: each is a
    job of a few big tasks, and a core left idle by one job's last task takes the next job's
    (Spark's FIFO scheduler runs the first job's tasks first; a fair scheduler pool per
    thread was measured and ends at the same time). Says how long each took (the times
    overlap): on a large run staging is long, and the split shows where the time goes."""
    tables = os.path.join(staging, "tables")
    path = {name: os.path.join(tables, name) for name in SCHEMAS}
    began = time.monotonic()
    files = _stage_attempts(os.path.join(staging, "attempts"), path["attempts"])
    say(f"  staged attempts ({files} round files, as written)")
    # read only by the tables staged in Spark (a run whose tables came from the tasks'
    # sums reads none: the read still cost the driver a file listing in the JVM)
    attempts_read = functools.cache(
        lambda: spark.read.schema(without_comments(data_schema(ATTEMPTS))).parquet(path["attempts"])
    )

    def stage(name: str, build: Callable[[], DataFrame]) -> None:
        began = time.monotonic()
        write_parquet(build(), path[name])
        say(f"  staged {name} ({time.monotonic() - began:.1f}s)")

    def load_and_summary() -> pd.DataFrame:
        began = time.monotonic()
        summed = small_tables(scenario, engines, known)
        if summed is not None:
            summed.write(path)
            took = time.monotonic() - began
            say(f"  staged load, instance_load and summary from the groups' sums ({took:.1f}s)")
            return summed.retries
        # four scans of every attempt that need nothing else: at once
        attempts = attempts_read()
        compact, times, changes, per_instance = run_together(
            [
                lambda: compact_attempts(attempts, scenario, known),
                lambda: times_to_settle(attempts, scenario, known),
                lambda: bucket_changes(attempts, scenario, known),
                lambda: changes_of_shared_groups(attempts, scenario, known),
            ]
        )
        say(f"  compacted the attempts for load and summary ({time.monotonic() - began:.1f}s)")
        stage(
            "load",
            lambda: load_from_attempts(spark, attempts, scenario, compact, changes).coalesce(1),
        )
        load = spark.read.parquet(path["load"])
        stage(
            "instance_load",
            lambda: instance_load_from(spark, attempts, scenario, load, per_instance).coalesce(1),
        )
        instance_load = spark.read.parquet(path["instance_load"])
        summary = summary_from(
            spark, attempts, load, scenario, engines, compact, times, changes, instance_load
        )
        stage("summary", lambda: summary.coalesce(1))
        return retries_by_level(attempts, compact)

    made_in_tasks = os.path.join(staging, TASK_TABLES_DIR)
    builds = {
        "dead_letters": lambda: dead_letters_from_attempts(attempts_read(), scenario, known),
        "messages": lambda: all_messages(spark, scenario),
        "transitions": lambda: transitions_from_attempts(attempts_read()),
    }
    work = [load_and_summary]
    for name in ("dead_letters", "messages", "transitions"):
        if name not in written:
            continue
        if os.path.isdir(os.path.join(made_in_tasks, name)):
            os.replace(os.path.join(made_in_tasks, name), path[name])
            say(f"  staged {name} (as the event-by-event stage wrote them)")
        else:
            work.insert(0, lambda name=name: stage(name, builds[name]))
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


def derived_for_lean(
    spark: SparkSession, scenario: Scenario, staged: dict[str, str]
) -> dict[str, Callable[[], DataFrame]]:
    """The staged data tables a lean run does not write, derived, so that validation checks
    them as readers will see them (data columns only, like the staged Parquet): builders,
    called only by a check that reads them in Spark (planning them is slow on a cold
    driver)."""
    derived: dict[str, Callable[[], DataFrame]] = {}
    if "transitions" not in staged:
        derived["transitions"] = lambda: transitions_from_attempts(
            spark.read.schema(without_comments(data_schema(ATTEMPTS))).parquet(staged["attempts"])
        )
    if "messages" not in staged:
        derived["messages"] = lambda: all_messages(spark, scenario)
    return derived


@dataclass(frozen=True)
class RunLabel:
    """Where a run belongs among replications: the id they share (None: the run's own), its
    plan point (None outside a plan) and its replication number (1-based)."""

    replication_of: str | None = None
    point: int | None = None
    replication: int = 1


def runs_row(
    spark: SparkSession,
    scenario: Scenario,
    run_id: str,
    started_at: dt.datetime,
    rounds: int,
    status: str = STATUS_COMPLETE,
    tables: str = "full",
    label: RunLabel | None = None,
) -> tuple:
    """The run's ``runs`` row, in the staged table's columns (``run_id`` is its partition)."""
    label = label or RunLabel()
    return (
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
        label.replication_of or run_id,
        label.point,
        label.replication,
        scenario.start_at,
    )
