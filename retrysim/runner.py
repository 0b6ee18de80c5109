"""One simulation run, end to end: lease -> engine -> staging -> checks -> publish.

Everything is staged under ``<output>/_staging/<run>-<token>`` first (Parquet, invisible to
readers) under a writer lease, validated, and only then published table by table, each as
one Delta commit, so readers see the run completely or not at all and a run that fails
before publishing leaves the tables as they were (docs/architecture.md, "Atomic runs").
"""

from __future__ import annotations

import datetime as dt
import os
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from retrysim.checks.validate import check_staged
from retrysim.engine.choice import SMALL_GROUP_MESSAGES, simulate_attempts
from retrysim.engine.rounds import TAIL_ROWS, Progress
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.spec import Scenario
from retrysim.store import views
from retrysim.store.lease import acquire_lease
from retrysim.store.recovery import publish_run, recover
from retrysim.store.sinks import STATUS_COMPLETE, STATUS_PUBLISHING, Sink, choose_sink
from retrysim.tables.schemas import RUNS, TABLE_SETS, data_schema, write_rows
from retrysim.tables.staging import RunLabel, derived_for_lean, runs_row, stage_tables
from retrysim.tables.task_tables import TASK_TABLES

# a run's staged report: (run id, each staged table's folder, retries by level) -> the
# function that writes it once the run is published, returning its path
DrawReport = Callable[[str, dict[str, str], pd.DataFrame], Callable[[], str]]
QUIET_S = 8.0  # a run with progress says a line at least this often (plus a second)


@contextmanager
def never_quiet(say: Progress, every_s: float = QUIET_S) -> Iterator[Progress]:
    """``say``, and from a watcher thread a line whenever nothing was said for ``every_s``
    seconds: the phase still running and for how long (a phase starts with a line that ends
    in `` ...``), so no phase of a long run is silent."""
    lock = threading.Lock()
    began = time.monotonic()
    state = {"last": began, "since": began, "phase": "simulating"}

    def said(line: str) -> None:
        with lock:
            state["last"] = time.monotonic()
            if line.endswith(" ..."):
                state["phase"], state["since"] = line.strip().removesuffix(" ..."), state["last"]
        say(line)

    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(min(1.0, every_s / 4)):
            with lock:
                quiet = time.monotonic() - state["last"] >= every_s
                phase, since = state["phase"], state["since"]
            if quiet:
                said(f"  ... {phase}: still running, {time.monotonic() - since:.0f}s")

    watcher = threading.Thread(target=watch, name="retrysim-progress", daemon=True)
    watcher.start()
    try:
        yield said
    finally:
        stop.set()
        watcher.join()


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
    # the run's retries by level (tables.load.retries_by_level), counted while staging
    retries: pd.DataFrame | None = field(default=None, repr=False)
    report: str | None = None  # its report's path, when simulate() was asked to draw it
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
    small_group: int = SMALL_GROUP_MESSAGES,
    unit_messages: int | None = None,
    tables: str = "full",
    validate: bool = True,
    report: DrawReport | None = None,
    label: RunLabel | None = None,
) -> Result:
    """Simulate ``scenario`` and write all eight tables under ``output`` (a temp dir if None).

    ``tables="lean"`` writes attempts, dead_letters, load, instance_load, summary and runs
    only, for very large runs: transitions and messages are derived when read
    (:mod:`retrysim.store.views`).

    ``tail_rows``: a round frontier of at most this many retrying messages is finished event
    by event in one stage (0: always one Spark stage per round). ``small_group``: a group on
    a finite pool with at most this many messages runs event by event from the start (0:
    rounds first, then the capacity check, as for larger groups). ``unit_messages``: a group
    simulated event by event with at least this many messages runs as its independent units
    (docs/model.md §5, "Units"; 0: always where it has several; None: from five million
    messages, with more than four units on more than four cores). The staged tables are
    validated before anything is published; a broken invariant raises
    :class:`retrysim.checks.validate.ValidationError` and leaves the tables as they were.
    ``report`` (as :func:`retrysim.reporting.report.draw_run_report` with its output bound)
    starts drawing the run's report from the staged tables before the check and writes it
    once the run is published: ``Result.report`` is its path. ``label`` places the run among
    replications in its ``runs`` row (:mod:`retrysim.planning.replications` runs them).

    >>> result = simulate(spark, load_scenario("conf/default.yaml"))  # doctest: +SKIP
    >>> result.summary.show()  # doctest: +SKIP
    """
    quiet = nullcontext(lambda _line: None)
    with never_quiet(progress) if progress is not None else quiet as say:
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
            written = TABLE_SETS[tables]
            rounds, engines, sums = simulate_attempts(
                spark, scenario, staging, say, tail_rows, small_group, unit_messages,
                tuple(table for table in TASK_TABLES if table in written),
            )  # fmt: skip
            say("staging tables ...")
            staged, retries = stage_tables(spark, scenario, staging, engines, written, say, sums)
            rows = {
                status: write_rows(
                    [runs_row(spark, scenario, run_id, started_at, rounds, status, tables, label)],
                    data_schema(RUNS),
                    os.path.join(staging, "tables", f"runs-{status}"),
                )
                for status in (STATUS_PUBLISHING, STATUS_COMPLETE)
            }
            staged["runs"] = rows[STATUS_COMPLETE]
            write_report = report(run_id, staged, retries) if report is not None else None
            if validate:
                say("validating the staged run ...")
                derived = derived_for_lean(spark, scenario, staged)
                check_staged(spark, staged, run_id, say, derived)
            publish_run(chosen, spark, output, staged, rows[STATUS_PUBLISHING], lease)
            say(f"committed {len(written)} tables with the {chosen.name} sink")
        finally:
            lease.release()
        elapsed = time.monotonic() - began
        drawn = write_report() if write_report is not None else None
        return Result(spark, output, run_id, rounds, chosen.name, elapsed, tables, retries, drawn)
