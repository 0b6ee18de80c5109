"""Capacity plans: run a scenario over a sweep grid and recommend the smallest consumer pool.

``retrysim plan`` (and ``jobs/capacity_plan.py``) takes a scenario, ``--sweep key=v1,v2``
axes (:mod:`retrysim.planning.sweep`) and ``--target metric=limit`` bounds
(:mod:`retrysim.planning.targets`).
Every point of the grid is validated before Spark starts; then each point is a run,
``<plan-id>-p<k>``, into the same output folder, or with ``--replications N`` N runs
``<plan-id>-p<k>-r<j>`` under their own seeds (:mod:`retrysim.planning.replications`), all
simulated together (:func:`retrysim.runner.simulate_runs`: one event-by-event stage or one
stage a round, one check and one commit a table for up to 100 runs); ``--search`` makes the
points as it bisects (:mod:`retrysim.planning.search`), each probe's replications together.
The driver reads back only each run's ``summary`` rows, never message-level rows. The
``plan`` table gets one row per point and group (run_id = the plan id) with the metrics
(means across the replications, with intervals), the targets a replication misses, the share
that meets them all, the recommended point of each group and case, and the binding target.
A plan id already in the folder is refused unless replaced (``replace``): its runs are then
named ``-e<n>`` and the earlier execution's runs removed once the new plan is published
(:mod:`retrysim.planning.plans`). A plan that fails removes the runs it had published, so it
leaves nothing behind.

>>> spec = prepare_plan("conf/flash-sale.yaml", sweeps=["consumers.threads=8,16,32"],
...                     targets=["p99_time_to_commit=1m"])  # doctest: +SKIP
>>> result = run_plan(spark, spec, "out", "flash-plan")  # doctest: +SKIP
>>> print(format_plan(result))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import itertools
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from retrysim.model.policy import policy_for
from retrysim.planning.plans import next_execution, point_run_id, remove_earlier_runs
from retrysim.planning.replications import (
    DEFAULT_CONFIDENCE,
    check_confidence,
    check_replications,
    interval,
    replication_requests,
    summary_rows,
)
from retrysim.planning.search import (
    SearchAxis,
    parse_search,
    probes_at_most,
    smallest_meeting,
)
from retrysim.planning.sweep import PlanPoint, SweepAxis, parse_sweep, plan_points, point_scenario
from retrysim.planning.targets import (
    Outcome,
    Recommendation,
    Target,
    aligned,
    check_targets,
    describe,
    judge,
    overall_pool,
    parse_target,
    recommend,
    show,
)
from retrysim.progress import Progress
from retrysim.runner import RUN_ID_PATTERN, simulate_runs
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.limits import MAX_PLAN_RUNS
from retrysim.scenario.loading import (
    DEFAULT_SCENARIO_PATH,
    apply_overrides,
    build_scenario,
    load_yaml,
)
from retrysim.scenario.spec import Scenario
from retrysim.store.runs import delete_runs, run_rows_by_id
from retrysim.store.sinks import DeltaSparkSink, Sink, choose_sink, read_table
from retrysim.tables.schemas import (
    PARTITION_COLUMN,
    PLAN,
    PLAN_METRICS,
    data_schema,
    without_comments,
)

MAX_PLAN_ID = 120  # leaves room for "-p100" within a run id's 128 characters

__all__ = [
    "PlanResult",
    "PlanSpec",
    "format_plan",
    "plan_execution",
    "prepare_plan",
    "read_plan",
    "run_plan",
]


@dataclass(frozen=True)
class PlanSpec:
    """A validated plan: the base scenario data (``--set`` applied), axes, targets, points,
    the replications of each point and the share of them a recommended pool must meet."""

    data: dict[str, Any]
    base: Scenario
    axes: tuple[SweepAxis, ...]
    targets: tuple[Target, ...]
    points: tuple[PlanPoint, ...]
    replications: int = 1
    confidence: float = DEFAULT_CONFIDENCE
    # --search: points are then the cases (the other axes' grid), each searched by bisection
    search: SearchAxis | None = None

    @property
    def most_points(self) -> int:
        """The most points the plan runs: the grid, or each case's most probes."""
        per_case = probes_at_most(self.search) if self.search is not None else 1
        return len(self.points) * per_case

    def case(self, point: PlanPoint, group: str) -> tuple[tuple[str, str], ...]:
        """The point's settings that do not set ``group``'s pool: the case it plans for."""
        return tuple(
            (axis.field if axis.group == group else axis.key, point.settings[axis.key])
            for axis in self.axes
            if not axis.touches_pool(group)
        )


def prepare_plan(
    scenario: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    sweeps: Sequence[str] = (),
    targets: Sequence[str] = (),
    replications: int = 1,
    confidence: float = DEFAULT_CONFIDENCE,
    search: str | None = None,
) -> PlanSpec:
    """Read and validate everything a plan needs; raises ScenarioError, starts no Spark."""
    check_replications(replications)
    check_confidence(confidence)
    data = apply_overrides(load_yaml(scenario or DEFAULT_SCENARIO_PATH), overrides)
    base = build_scenario(copy.deepcopy(data))
    axes = tuple(parse_sweep(text, data) for text in sweeps)
    parsed = tuple(parse_target(text, [g.name for g in base.groups]) for text in targets)
    check_targets(parsed)
    found = parse_search(search, data) if search is not None else None
    if found is not None:
        _check_search(found, axes, parsed, data, base)
    spec = PlanSpec(
        data, base, axes, parsed, tuple(plan_points(data, axes)), replications, confidence, found
    )
    if spec.most_points * replications > MAX_PLAN_RUNS:
        raise ScenarioError(
            "--replications",
            f"{spec.most_points} points x {replications} replications make up to "
            f"{spec.most_points * replications:,} runs; at most {MAX_PLAN_RUNS:,} are allowed",
        )
    return spec


def _check_search(
    search: SearchAxis,
    axes: Sequence[SweepAxis],
    targets: Sequence[Target],
    data: dict,
    base: Scenario,
) -> None:
    """A search needs a target of the searched group, a finite pool, no sweep of that pool,
    and valid ends."""
    if not any(target.applies_to(search.group) for target in targets):
        raise ScenarioError(
            "--search",
            f"{search.given}: give a --target that group {search.group} must meet to search for",
        )
    group = next(g for g in base.groups if g.name == search.group)
    if group.consumers.pool_size is None:
        raise ScenarioError(
            "--search",
            f"{search.given}: group {search.group}'s pool is unlimited; set "
            "consumers: {instances, threads} to search a finite one",
        )
    downstream = group.behavior.downstream
    if downstream is not None and (search.field.endswith("threads") or downstream.shared):
        raise ScenarioError(
            "--search",
            f"{search.given}: group {search.group} has a downstream that answers to load: a "
            "larger pool can miss a target a smaller one meets (more calls at once), so a "
            "bisection can miss the answer; sweep a grid instead (--sweep "
            f"{search.field}=...)",
        )
    for axis in axes:
        if axis.touches_pool(search.group):
            raise ScenarioError(
                "--search",
                f"{search.given}: --sweep {axis.given} sets the same group's pool; search "
                "one pool key and sweep the others' settings",
            )
    for value in (search.low, search.high):
        try:
            point_scenario(data, {search.key: str(value)})
        except ScenarioError as error:
            raise ScenarioError(f"--search {search.given}", f"value {value}: {error}") from None


def check_plan_id(plan_id: str, spec: PlanSpec | None = None, execution: int = 1) -> str:
    """A plan id that names its points' runs (``<plan-id>-p<k>``, ``-r<j>`` with replications,
    ``-e<n>`` in its n-th execution)."""
    if not RUN_ID_PATTERN.match(plan_id) or len(plan_id) > MAX_PLAN_ID:
        raise ScenarioError(
            "--plan-id",
            f"value {plan_id!r}: use 1-{MAX_PLAN_ID} letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (each point runs as <plan-id>-p<k>)",
        )
    if spec is not None:
        last = point_run_id(plan_id, spec.most_points, execution)
        check_replications(spec.replications, last, "--plan-id")
    return plan_id


def default_plan_id(scenario: Scenario) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", scenario.name).strip("-")[:80] or "scenario"
    return f"{name}-plan-{stamp}-{uuid.uuid4().hex[:6]}"


def plan_execution(output: str, plan_id: str, spec: PlanSpec, replace: bool = False) -> int:
    """The execution a run of ``plan_id`` into ``output`` is (1 for a new plan; a plan there
    is refused unless ``replace``: :func:`retrysim.planning.plans.next_execution`), its
    runs' names checked for length."""
    check_plan_id(plan_id, spec)
    execution = next_execution(output, plan_id, replace)
    check_plan_id(plan_id, spec, execution)
    return execution


@dataclass
class PlanResult:
    """A finished plan: one Outcome per point and group, and the recommendations."""

    spark: SparkSession
    output: str
    plan_id: str
    spec: PlanSpec
    outcomes: list[Outcome]
    recommendations: list[Recommendation]
    elapsed_s: float
    points: list[PlanPoint]  # the points run, in order (a search's probes)
    execution: int = 1  # the plan's n-th execution in the folder (its runs' -e<n>)

    @property
    def table(self) -> DataFrame:
        return read_plan(self.spark, self.output, self.plan_id)


def read_plan(spark: SparkSession, output: str, plan_id: str) -> DataFrame:
    """The plan's rows of the ``plan`` table."""
    return read_table(spark, output, "plan").where(F.col(PARTITION_COLUMN) == F.lit(plan_id))


def run_plan(
    spark: SparkSession,
    spec: PlanSpec,
    output: str,
    plan_id: str,
    progress: Progress | None = None,
    sink: str | Sink = "auto",
    verbose: bool = False,
    validate: bool = True,
    replace: bool = False,
) -> PlanResult:
    """Run every point (each ``spec.replications`` times), write the ``plan`` table, and
    return the outcomes and the recommendations. ``progress`` gets one line per point (and
    the engine's lines with ``verbose``); ``validate`` checks each run's invariants before it
    is published, as :func:`retrysim.runner.simulate` does. A plan id already in ``output``
    is refused unless ``replace``: then its earlier runs are removed after the new plan rows
    are published, so readers see the old plan until the new one is there. A plan that fails
    removes the runs it published (best effort)."""
    say = progress or (lambda _line: None)
    output = os.path.abspath(output)
    execution = plan_execution(output, plan_id, spec, replace)
    chosen = sink if not isinstance(sink, str) else choose_sink(spark, sink)
    committer = spark if isinstance(chosen, DeltaSparkSink) else None  # removals: same sink
    began = time.monotonic()
    outcomes: list[Outcome] = []
    ran: list[PlanPoint] = []
    published: list[str] = []

    def run_points(points: Sequence[PlanPoint], tags: Sequence[str]) -> list[list[Outcome]]:
        """Simulate the points' replications together; each point's outcomes."""
        for point, tag in zip(points, tags, strict=True):
            say(f"{tag} ({_settings(point)}) ...")
        requests = [
            request
            for point in points
            for request in replication_requests(
                point.scenario, spec.replications,
                point_run_id(plan_id, point.number, execution), point.number,
            )
        ]  # fmt: skip
        if len(requests) > 1:
            say(f"simulating {len(requests)} runs together ...")
        started = time.monotonic()
        published.extend(request.run_id for request in requests)
        simulate_runs(
            spark, requests, output, _runs_progress(say) if verbose else None, chosen,
            validate=validate,
        )  # fmt: skip
        elapsed = time.monotonic() - started
        rows = summary_rows(spark, output, [request.run_id for request in requests])
        found = []
        for point, tag in zip(points, tags, strict=True):
            mine = [row for row in rows if row["point"] == point.number]
            outcome = [
                _outcome(spec, point, group.name, [r for r in mine if r["group"] == group.name])
                for group in point.scenario.groups
            ]
            ran.append(point)
            outcomes.extend(outcome)
            found.append(outcome)
            say(f"{tag} done: " + "; ".join(map(_brief, outcome)))
        say(f"{len(requests)} run{'s' if len(requests) > 1 else ''} in {elapsed:.1f}s")
        return found

    try:
        if spec.search is None:
            count = len(spec.points)
            run_points(spec.points, [f"point {point.number}/{count}" for point in spec.points])
        else:
            numbers = itertools.count(1)

            def run_point(point: PlanPoint, tag: str) -> list[Outcome]:
                return run_points([point], [tag])[0]

            for case in spec.points:
                _search_case(spec, case, numbers, run_point, say)
        recommendations = recommend(outcomes) if spec.targets else []
        rows = plan_rows(spec, plan_id, outcomes, recommendations, ran, execution)
        write_plan_table(spark, output, plan_id, rows, chosen)
    except BaseException:
        # this execution's runs have names of their own: removing them leaves the earlier
        # execution, if any, as it was; under their leases, so a live writer of the same
        # names (a second --replace of the plan at the same time) keeps its runs
        with contextlib.suppress(Exception):
            written = run_rows_by_id(output)
            delete_runs(output, [r for r in published if r in written], spark=committer)
        raise
    if execution > 1:
        remove_earlier_runs(output, plan_id, published, say, committer)
    elapsed = time.monotonic() - began
    return PlanResult(
        spark, output, plan_id, spec, outcomes, recommendations, elapsed, ran, execution
    )


def _settings(point: PlanPoint) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.settings.items()) or "the scenario as is"


def _runs_progress(say: Progress) -> Progress:
    """The engine's lines of the points' runs, indented under the plan's."""
    return lambda line: say(f"  {line}")


def _search_case(
    spec: PlanSpec,
    case: PlanPoint,
    numbers: Iterator[int],
    run_point: Callable[[PlanPoint, str], list[Outcome]],
    say: Progress,
) -> None:
    """Bisect the searched key within one case (the settings of the other axes)."""
    search = spec.search
    assert search is not None
    shown = ", ".join(f"{k}={v}" for k, v in case.settings.items())
    say(f"searching {search} for group {search.group}" + (f" [{shown}]" if shown else "") + " ...")
    probes: list[tuple[int, bool]] = []
    most = probes_at_most(search)

    def meets(value: int) -> bool:
        settings = {**case.settings, search.key: str(value)}
        point = PlanPoint(next(numbers), settings, point_scenario(spec.data, settings))
        found = run_point(
            point, f"point {point.number} (probe {len(probes) + 1} of at most {most})"
        )
        verdict = next(o for o in found if o.group == search.group).meets
        probes.append((value, verdict))
        return verdict

    answer = smallest_meeting(meets, search.low, search.high)
    tried = ", ".join(f"{value} {'met' if ok else 'missed'}" for value, ok in probes)
    say(
        f"search {search.field} for group {search.group}: "
        + (f"smallest meeting {answer}" if answer is not None else "no value in the range meets")
        + f" ({len(probes)} probes: {tried})"
    )


def _outcome(
    spec: PlanSpec, point: PlanPoint, group: str, runs: Sequence[dict[str, Any]]
) -> Outcome:
    """A point's outcome for ``group`` from its replications' summary rows: the metrics are
    their means, the targets judged per replication."""
    config = next(g for g in point.scenario.groups if g.name == group)
    consumers = config.consumers
    unlimited = consumers.pool_size is None
    topology = policy_for(config, point.scenario.broker.message_delay_level).topology
    found = {column: interval([run.get(column) for run in runs]) for column in PLAN_METRICS}
    metrics: dict[str, Any] = dict(runs[0])  # the non-numeric ones (busiest_instance) as run 1
    metrics.update({column: found[column].mean for column in PLAN_METRICS})
    failed, misses, share = judge(runs, spec.targets, group)
    return Outcome(
        point=point.number,
        group=group,
        case=spec.case(point, group),
        instances=None if unlimited else consumers.instances,
        threads=None if unlimited else consumers.threads,
        pool=consumers.pool_size,
        metrics=metrics,
        failed=failed,
        topology=topology,
        replications=len(runs),
        met_share=share,
        confidence=spec.confidence,
        misses=misses,
        intervals={c: (i.low, i.high) for c, i in found.items() if i.low is not None},
    )


def _brief(outcome: Outcome) -> str:
    m = outcome.metrics
    verdict = "" if not outcome.failed else " misses " + ",".join(t.metric for t in outcome.failed)
    if outcome.failed and outcome.replications > 1:
        verdict += f" ({_met(outcome)} meet all)"
    return (
        f"{outcome.group} p99 commit {show('duration', m.get('p99_time_to_commit_ms'))}, "
        f"max Ready {show('count', m.get('max_ready_backlog'))}{verdict}"
    )


def plan_rows(
    spec: PlanSpec,
    plan_id: str,
    outcomes: Sequence[Outcome],
    recs: Sequence[Recommendation],
    points: Sequence[PlanPoint] | None = None,
    execution: int = 1,
) -> list[tuple]:
    """Rows of the plan table (its data schema: every column but run_id); each point names
    its run of the plan's ``execution``."""
    chosen = {(r.group, r.point): r for r in recs if r.found}
    settings = {p.number: p.setting_values() for p in (spec.points if points is None else points)}
    names = [f.name for f in data_schema(PLAN).fields]
    rows = []
    for o in outcomes:
        rec = chosen.get((o.group, o.point))
        targets = {t.column: t.limit for t in spec.targets if t.applies_to(o.group)}
        targets.update({t.column: t.limit for t in spec.targets if t.group == o.group})
        values = {
            "point": o.point,
            "point_run_id": point_run_id(plan_id, o.point, execution),
            "group": o.group,
            "settings_json": json.dumps(settings[o.point], sort_keys=True),
            "instances": o.instances,
            "threads": o.threads,
            "pool": o.pool,
            **{column: o.metrics.get(column) for column in PLAN_METRICS},
            "targets_json": json.dumps(targets, sort_keys=True),
            "replications": o.replications,
            "confidence": spec.confidence if spec.targets else None,
            "meets_targets_share": o.met_share if spec.targets else None,
            "meets_targets": o.meets if spec.targets else None,
            "failed_targets": ",".join(t.metric for t in o.failed) or None,
            "recommended": rec is not None,
            "binding_target": (",".join(t.metric for t in rec.binding) or "none") if rec else None,
            **{
                f"{column}_ci_{end}": bounds[k]
                for column, bounds in o.intervals.items()
                for k, end in enumerate(("low", "high"))
            },
        }
        rows.append(tuple(_typed(values.get(name), PLAN[name].dataType) for name in names))
    return rows


def _typed(value: Any, dtype: Any) -> Any:
    if value is None:
        return None
    name = dtype.typeName()
    if name == "double":
        return float(value)
    if name in ("integer", "long"):
        return int(value)
    return value


def write_plan_table(
    spark: SparkSession, output: str, plan_id: str, rows: list[tuple], sink: Sink
) -> None:
    """Stage the rows as Parquet and publish them as the plan's partition (one commit)."""
    staging_root = os.path.join(output, "_staging")
    staging = os.path.join(staging_root, f"plan-{plan_id}-{uuid.uuid4().hex[:8]}")
    try:
        schema = without_comments(data_schema(PLAN))  # what Spark writes has none
        spark.createDataFrame(rows, schema).coalesce(1).write.parquet(staging)
        sink.publish(spark, output, "plan", staging, plan_id)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(staging_root)


# --------------------------------------------------------------------------- text output

_COLUMNS = (
    ("p99 commit", "p99_time_to_commit_ms", "duration"),
    ("max Ready", "max_ready_backlog", "count"),
    ("oldest Ready", "max_oldest_ready_age_ms", "duration"),
    ("DLQ", "dlq", "count"),
    ("pending", "pending", "count"),
    ("peak util", "peak_utilization", "fraction"),
    ("busiest inst", "busiest_instance_utilization", "fraction"),
    ("idle", "idle_instances", "count"),
)


def format_plan(result: PlanResult) -> str:
    """The plan as a compact table per group, then the recommendations."""
    spec = result.spec
    runs = f" x {spec.replications} replications" if spec.replications > 1 else ""
    lines = [f"plan {result.plan_id}: {len(result.points)} points{runs} in {result.elapsed_s:.0f}s"]
    lines.append("targets: " + ("; ".join(map(str, spec.targets)) or "none given"))
    if spec.search is not None:
        lines.append(f"search: bisection of {spec.search} (each point a probe)")
    if spec.replications > 1:
        lines.append(
            f"each value: the mean of {spec.replications} replications ± half its 95% interval; "
            f"a pool meets the targets when {spec.confidence:.0%} of its replications meet them all"
        )
    chosen = {(r.group, r.point) for r in result.recommendations if r.found}
    for group in dict.fromkeys(o.group for o in result.outcomes):
        lines.append(f"group {group}")
        table = [["point", "case", "pool", *(c[0] for c in _COLUMNS), "targets"]]
        mine = [o for o in result.outcomes if o.group == group]
        if spec.search is not None:  # probes in pool order, not the order they ran
            mine.sort(key=lambda o: (o.case, o.pool is None, o.pool or 0))
        for o in mine:
            pool = "unlimited" if o.pool is None else f"{o.instances}x{o.threads}={o.pool}"
            verdict = "-" if not spec.targets else _verdict(o)
            if (group, o.point) in chosen:
                verdict += "  <- recommended"
            case = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in o.case) or "-"
            table.append(
                [
                    f"p{o.point}",
                    case,
                    pool,
                    *(_with_interval(o, col, kind) for _, col, kind in _COLUMNS),
                    verdict,
                ]
            )
        lines += aligned(table)
    lines.append("recommendation:" if spec.targets else "no --target given: no recommendation")
    for rec in result.recommendations:
        lines.append("  " + describe(rec))
    for group in dict.fromkeys(r.group for r in result.recommendations):
        if len({r.case for r in result.recommendations if r.group == group}) > 1:
            pool = overall_pool(result.outcomes, group)
            lines.append(
                f"  group {group}, every swept case: "
                + (f"{pool:,} consumer threads" if pool else "no swept pool meets them all")
            )
    return "\n".join(lines)


def _met(outcome: Outcome) -> str:
    n = outcome.replications
    return f"{round((outcome.met_share or 0) * n)}/{n}"


def _verdict(outcome: Outcome) -> str:
    """met / missed and the targets missed; with replications how many met them all and how
    many missed each."""
    if outcome.replications == 1:
        return "met" if outcome.meets else "missed: " + ",".join(t.metric for t in outcome.failed)
    n = outcome.replications
    text = f"{'met' if outcome.meets else 'missed'} ({_met(outcome)} meet all)"
    if outcome.failed:
        text += ": " + ",".join(
            f"{t.metric} {outcome.misses[t.metric]}/{n}" for t in outcome.failed
        )
    return text


def _with_interval(outcome: Outcome, column: str, kind: str) -> str:
    """The mean, and ± half the interval's width when there is one (its upper half: the low
    end is cut at 0)."""
    mean = outcome.metrics.get(column)
    _, high = outcome.intervals.get(column, (None, None))
    if mean is None or high is None or high == mean:
        return show(kind, mean)
    return f"{show(kind, mean)}±{show(kind, high - mean)}"
