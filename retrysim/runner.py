"""One simulation run, end to end: lease -> engine -> staging -> checks -> publish.

Everything is staged under ``<output>/_staging/<run>-<token>`` first (Parquet, invisible to
readers) under a writer lease, validated, and only then published table by table, each as
one Delta commit, so readers see the run completely or not at all and a run that fails
before publishing leaves the tables as they were (docs/architecture.md, "Atomic runs").
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from retrysim.checks.validate import StagedRun, check_staged_runs
from retrysim.engine.choice import SMALL_GROUP_MESSAGES, simulate_runs_attempts
from retrysim.progress import Progress
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.limits import TAIL_ROWS
from retrysim.scenario.spec import Scenario
from retrysim.store import views
from retrysim.store.lease import Lease, acquire_lease
from retrysim.store.recovery import publish_runs, recover
from retrysim.store.sinks import STATUS_COMPLETE, STATUS_PUBLISHING, Sink, choose_sink
from retrysim.tables.message_tables import TASK_TABLES
from retrysim.tables.schemas import RUNS, TABLE_SETS, data_schema, write_rows
from retrysim.tables.staging import RunLabel, derived_for_lean, runs_row, stage_tables

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
    request = RunRequest(scenario, run_id, label)
    results = simulate_runs(
        spark, [request], output, progress, sink, tail_rows, small_group, unit_messages, tables,
        validate, report,
    )  # fmt: skip
    return results[0]


@dataclass(frozen=True)
class RunRequest:
    """One run of :func:`simulate_runs`: its scenario, run id (None: a new one) and place
    among replications."""

    scenario: Scenario
    run_id: str | None = None
    label: RunLabel | None = None


def simulate_runs(
    spark: SparkSession,
    requests: Sequence[RunRequest],
    output: str | None = None,
    progress: Progress | None = None,
    sink: str | Sink = "auto",
    tail_rows: int = TAIL_ROWS,
    small_group: int = SMALL_GROUP_MESSAGES,
    unit_messages: int | None = None,
    tables: str = "full",
    validate: bool = True,
    report: DrawReport | None = None,
    on_result: Callable[[int, Result], None] | None = None,
) -> list[Result]:
    """:func:`simulate` for several runs at once (a plan's points and replications): each
    is staged under its own lease and published as its own run, but they are simulated
    together (:func:`retrysim.engine.choice.simulate_runs_attempts`: one event-by-event
    stage, one stage a round for the round engine's runs) and checked in one pass, so a
    cluster runs them side by side and a small machine pays
    the fixed costs once; they are published together too, each table one Delta commit
    for all of them, so they appear at once. Nothing is published unless every run passes
    its check, and a failure while publishing removes them all again. Many runs go in
    batches (:func:`runs_together`), each of them so. ``on_result(k, result)`` is called for
    the ``k``-th run (0-based) once its batch is published."""
    quiet = nullcontext(lambda _line: None)
    with never_quiet(progress) if progress is not None else quiet as say:
        if tables not in TABLE_SETS:
            raise ScenarioError("--tables", f"value {tables!r}: use one of {', '.join(TABLE_SETS)}")
        output = os.path.abspath(output or tempfile.mkdtemp(prefix="retrysim-"))
        run_ids = [check_run_id(r.run_id or default_run_id(r.scenario)) for r in requests]
        if len(set(run_ids)) < len(run_ids):
            raise ScenarioError("--run-id", "runs simulated together need different run ids")
        chosen = sink if not isinstance(sink, str) else choose_sink(spark, sink)
        options = _Options(tail_rows, small_group, unit_messages, tables, validate, report)
        batches = runs_together([request.scenario for request in requests])
        results: list[Result] = []
        for batch in batches:
            if len(batches) > 1:
                say(f"runs {batch[0] + 1}-{batch[-1] + 1} of {len(requests)} together ...")
            mine = [(requests[k], run_ids[k]) for k in batch]
            for result in _simulate_batch(spark, mine, output, chosen, options, say):
                results.append(result)
                if on_result is not None:
                    on_result(len(results) - 1, result)
        return results


# Runs simulated together hold, on the driver until staged, each whole group's bucket sums
# (retrysim.tables.key_peaks), and stage all their tables before any is published: a plan
# goes in batches of at most this many runs and load buckets (groups x horizon / bucket).
MOST_RUNS_TOGETHER = 100
MOST_BUCKETS_TOGETHER = 2_000_000


def runs_together(scenarios: Sequence[Scenario]) -> list[list[int]]:
    """The runs (their positions) simulated together, batch by batch, in order."""
    batches: list[list[int]] = []
    buckets = 0
    for number, scenario in enumerate(scenarios):
        mine = len(scenario.groups) * -(-scenario.horizon // scenario.load_bucket)
        if (
            not batches
            or len(batches[-1]) >= MOST_RUNS_TOGETHER
            or buckets + mine > MOST_BUCKETS_TOGETHER
        ):
            batches.append([])
            buckets = 0
        batches[-1].append(number)
        buckets += mine
    return batches


@dataclass(frozen=True)
class _Options:
    """How :func:`simulate_runs` runs each batch (see :func:`simulate`)."""

    tail_rows: int
    small_group: int
    unit_messages: int | None
    tables: str
    validate: bool
    report: DrawReport | None


def _simulate_batch(
    spark: SparkSession,
    requests: list[tuple[RunRequest, str]],
    output: str,
    chosen: Sink,
    options: _Options,
    say: Progress,
) -> list[Result]:
    """One batch of :func:`simulate_runs`: leases, engine, staging, check, publish."""
    leases: list[Lease] = []
    began = time.monotonic()
    started_at = dt.datetime.now(dt.UTC)
    several = len(requests) > 1  # their staging lines would repeat for each run
    preparing = threading.Thread(target=chosen.prepare, args=(spark,), daemon=True)
    preparing.start()
    reports = _Reports(options.report, spark.sparkContext.defaultParallelism if several else None)
    try:
        for _, run_id in requests:  # each as taken: a later refusal releases the earlier
            leases.append(acquire_lease(output, run_id))
        recover(output, say)
        written = TABLE_SETS[options.tables]
        engined = simulate_runs_attempts(
            spark,
            [(r.scenario, lease.staging) for (r, _), lease in zip(requests, leases, strict=True)],
            say, options.tail_rows, options.small_group, options.unit_messages,
            tuple(table for table in TASK_TABLES if table in written),
        )  # fmt: skip
        if several:
            say(f"staging the tables of {len(requests)} runs ...")
        staging_began = time.monotonic()
        staged_runs = []
        for (request, _), lease, engine in zip(requests, leases, engined, strict=True):
            run = _stage_run(spark, request, lease, engine, written, started_at, options.tables,
                             (lambda _line: None) if several else say)  # fmt: skip
            reports.start(lease.run_id, run.check.staged, run.retries)
            staged_runs.append(run)
        if several:
            say(f"staged {len(requests)} runs ({time.monotonic() - staging_began:.1f}s)")
        if options.validate:
            say(f"validating the {len(requests)} staged runs ..." if several else
                "validating the staged run ...")  # fmt: skip
            check_staged_runs(spark, [run.check for run in staged_runs], say)
        if several:
            say(f"publishing {len(requests)} runs ...")
        preparing.join()
        publishing_began = time.monotonic()
        publish_runs(
            chosen,
            spark,
            output,
            [(run.check.staged, run.marker, run.lease) for run in staged_runs],
        )
        say(
            f"committed {len(written)} tables with the {chosen.name} sink"
            + (f", {len(requests)} runs in each commit" if several else "")
            + f" ({time.monotonic() - publishing_began:.1f}s)"
        )
    except BaseException:
        reports.discard()
        raise
    finally:
        for lease in leases:
            lease.release()
    elapsed = time.monotonic() - began
    drawn = reports.finish()
    return [
        Result(spark, output, run.lease.run_id, run.rounds, chosen.name, elapsed, options.tables,
               run.retries, drawn.get(run.lease.run_id))
        for run in staged_runs
    ]  # fmt: skip


class _Reports:
    """A batch's run reports, each drawn from its staged tables in a forked process
    (:func:`retrysim.reporting.report.draw_run_report`) beside the check and written once
    the run is published. With several runs at most ``window`` draw at once: the oldest is
    written as the next starts, before its run is published, and removed again if the batch
    fails."""

    def __init__(self, draw: DrawReport | None, window: int | None) -> None:
        self.draw, self.window = draw, window
        self.pending: list[tuple[str, Callable[[], str]]] = []
        self.written: dict[str, str] = {}

    def start(self, run_id: str, staged: dict[str, str], retries: pd.DataFrame) -> None:
        if self.draw is None:
            return
        if self.window is not None and len(self.pending) >= self.window:
            oldest, write = self.pending.pop(0)
            self.written[oldest] = write()
        self.pending.append((run_id, self.draw(run_id, staged, retries)))

    def finish(self) -> dict[str, str]:
        """Every report written: run id -> path."""
        while self.pending:
            run_id, write = self.pending.pop(0)
            self.written[run_id] = write()
        return self.written

    def discard(self) -> None:
        """The batch failed: no report of it stays (a drawing still running is waited for,
        as its process would wait to hand over its page)."""
        with contextlib.suppress(Exception):
            self.finish()
        for path in self.written.values():
            with contextlib.suppress(OSError):
                os.remove(path)


@dataclass
class _StagedRun:
    """A run staged and waiting for its check and commits."""

    lease: Lease
    check: StagedRun  # its tables and their run id, as the check takes them
    marker: str  # its runs row with status publishing
    rounds: int
    retries: pd.DataFrame


def _stage_run(
    spark: SparkSession,
    request: RunRequest,
    lease: Lease,
    engined: tuple[int, dict[str, str], dict],
    written: tuple[str, ...],
    started_at: dt.datetime,
    tables: str,
    say: Progress,
) -> _StagedRun:
    """A run's tables staged from its attempts, and its runs rows."""
    rounds, engines, sums = engined
    scenario, run_id, staging = request.scenario, lease.run_id, lease.staging
    say("staging tables ...")
    staged, retries = stage_tables(spark, scenario, staging, engines, written, say, sums)
    rows = {
        status: write_rows(
            [runs_row(spark, scenario, run_id, started_at, rounds, status, tables, request.label)],
            data_schema(RUNS),
            os.path.join(staging, "tables", f"runs-{status}"),
        )
        for status in (STATUS_PUBLISHING, STATUS_COMPLETE)
    }
    staged["runs"] = rows[STATUS_COMPLETE]
    derived = derived_for_lean(spark, scenario, staged)
    check = StagedRun(run_id, staged, derived)
    return _StagedRun(lease, check, rows[STATUS_PUBLISHING], rounds, retries)
