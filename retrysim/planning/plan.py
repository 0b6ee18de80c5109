"""Capacity plans: run a scenario over a sweep grid and recommend the smallest consumer pool.

``retrysim plan`` (and ``jobs/capacity_plan.py``) takes a scenario, ``--sweep key=v1,v2``
axes (:mod:`retrysim.planning.sweep`) and ``--target metric=limit`` bounds
(:mod:`retrysim.planning.targets`).
Every point of the grid is validated before Spark starts; then each point is one
:func:`retrysim.runner.simulate` run, ``<plan-id>-p<k>``, into the same output folder. The
driver reads back only each run's ``summary`` rows and one aggregate of its ``load`` table
(the oldest Ready age), never message-level rows. The ``plan`` table gets one row per point
and group (run_id = the plan id; running the same plan id again replaces its rows) with
the metrics, the targets each point misses, the recommended point of each group and case,
and the binding target.

>>> spec = prepare_plan("conf/flash-sale.yaml", sweeps=["consumers.threads=8,16,32"],
...                     targets=["p99_time_to_commit=1m"])  # doctest: +SKIP
>>> result = run_plan(spark, spec, "out", "flash-plan")  # doctest: +SKIP
>>> print(format_plan(result))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import json
import os
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from retrysim.engine.rounds import Progress
from retrysim.model.policy import policy_for
from retrysim.planning.sweep import PlanPoint, SweepAxis, parse_sweep, plan_points
from retrysim.planning.targets import (
    Outcome,
    Recommendation,
    Target,
    check_targets,
    describe,
    evaluate,
    overall_pool,
    parse_target,
    recommend,
    show,
)
from retrysim.runner import RUN_ID_PATTERN, Result, simulate
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import (
    DEFAULT_SCENARIO_PATH,
    apply_overrides,
    build_scenario,
    load_yaml,
)
from retrysim.scenario.spec import Scenario
from retrysim.store.sinks import Sink, choose_sink, read_table, remove_tree
from retrysim.tables.schemas import PARTITION_COLUMN, PLAN, data_schema

MAX_PLAN_ID = 120  # leaves room for "-p100" within a run id's 128 characters
# Summary columns copied into the plan table as they are.
SUMMARY_COLUMNS = (
    "messages",
    "deliveries",
    "commits",
    "dlq",
    "discards",
    "pending",
    "amplification",
    "write_amplification",
    "p50_time_to_commit_ms",
    "p95_time_to_commit_ms",
    "p99_time_to_commit_ms",
    "p99_time_to_dlq_ms",
    "max_ready_backlog",
    "max_waiting_retry",
    "peak_utilization",
)

__all__ = [
    "PlanResult",
    "PlanSpec",
    "format_plan",
    "prepare_plan",
    "read_plan",
    "run_plan",
]


@dataclass(frozen=True)
class PlanSpec:
    """A validated plan: the base scenario data (``--set`` applied), axes, targets, points."""

    data: dict[str, Any]
    base: Scenario
    axes: tuple[SweepAxis, ...]
    targets: tuple[Target, ...]
    points: tuple[PlanPoint, ...]

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
) -> PlanSpec:
    """Read and validate everything a plan needs; raises ScenarioError, starts no Spark."""
    data = apply_overrides(load_yaml(scenario or DEFAULT_SCENARIO_PATH), overrides)
    base = build_scenario(copy.deepcopy(data))
    axes = tuple(parse_sweep(text, data) for text in sweeps)
    parsed = tuple(parse_target(text, [g.name for g in base.groups]) for text in targets)
    check_targets(parsed)
    points = tuple(plan_points(data, axes))
    return PlanSpec(data, base, axes, parsed, points)


def check_plan_id(plan_id: str) -> str:
    if not RUN_ID_PATTERN.match(plan_id) or len(plan_id) > MAX_PLAN_ID:
        raise ScenarioError(
            "--plan-id",
            f"value {plan_id!r}: use 1-{MAX_PLAN_ID} letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (each point runs as <plan-id>-p<k>)",
        )
    return plan_id


def default_plan_id(scenario: Scenario) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", scenario.name).strip("-")[:80] or "scenario"
    return f"{name}-plan-{stamp}-{uuid.uuid4().hex[:6]}"


def point_run_id(plan_id: str, number: int) -> str:
    return f"{plan_id}-p{number}"


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

    @property
    def table(self) -> DataFrame:
        return read_plan(self.spark, self.output, self.plan_id)


def read_plan(spark: SparkSession, output: str, plan_id: str) -> DataFrame:
    """The plan's rows of the ``plan`` table."""
    return read_table(spark, output, "plan").where(F.col(PARTITION_COLUMN) == F.lit(plan_id))


def point_metrics(result: Result) -> dict[str, dict[str, Any]]:
    """Per group: the summary columns the plan table and its targets read (one row per group
    reaches the driver)."""
    return {row["group"]: row.asDict() for row in result.summary.collect()}


def run_plan(
    spark: SparkSession,
    spec: PlanSpec,
    output: str,
    plan_id: str,
    progress: Progress | None = None,
    sink: str | Sink = "auto",
    verbose: bool = False,
    validate: bool = True,
) -> PlanResult:
    """Run every point, write the ``plan`` table, and return the outcomes and the
    recommendations. ``progress`` gets one line per point (and the engine's lines with
    ``verbose``); ``validate`` checks each point's invariants before it is published, as
    :func:`retrysim.runner.simulate` does."""
    say = progress or (lambda _line: None)
    output = os.path.abspath(output)
    chosen = sink if not isinstance(sink, str) else choose_sink(spark, sink)
    began = time.monotonic()
    outcomes: list[Outcome] = []
    total = len(spec.points)
    for point in spec.points:
        tag = f"point {point.number}/{total}"
        shown = ", ".join(f"{k}={v}" for k, v in point.settings.items()) or "the scenario as is"
        say(f"{tag} ({shown}) ...")
        result = simulate(
            spark,
            point.scenario,
            output=output,
            run_id=point_run_id(plan_id, point.number),
            progress=(lambda line, t=tag: say(f"  {t}: {line}")) if verbose else None,
            sink=chosen,
            validate=validate,
        )
        metrics = point_metrics(result)
        found = [
            _outcome(spec, point, group.name, metrics[group.name])
            for group in point.scenario.groups
        ]
        outcomes += found
        say(f"{tag} done in {result.elapsed_s:.1f}s: " + "; ".join(map(_brief, found)))
    recommendations = recommend(outcomes) if spec.targets else []
    write_plan_table(
        spark, output, plan_id, plan_rows(spec, plan_id, outcomes, recommendations), chosen
    )
    return PlanResult(
        spark, output, plan_id, spec, outcomes, recommendations, time.monotonic() - began
    )


def _outcome(spec: PlanSpec, point: PlanPoint, group: str, metrics: dict[str, Any]) -> Outcome:
    config = next(g for g in point.scenario.groups if g.name == group)
    consumers = config.consumers
    unlimited = consumers.pool_size is None
    topology = policy_for(config, point.scenario.broker.message_delay_level).topology
    return Outcome(
        point=point.number,
        group=group,
        case=spec.case(point, group),
        instances=None if unlimited else consumers.instances,
        threads=None if unlimited else consumers.threads,
        pool=consumers.pool_size,
        metrics=metrics,
        failed=tuple(evaluate(metrics, spec.targets, group)),
        topology=topology,
    )


def _brief(outcome: Outcome) -> str:
    m = outcome.metrics
    verdict = "" if not outcome.failed else " misses " + ",".join(t.metric for t in outcome.failed)
    return (
        f"{outcome.group} p99 commit {show('duration', m.get('p99_time_to_commit_ms'))}, "
        f"max Ready {show('count', m.get('max_ready_backlog'))}{verdict}"
    )


def plan_rows(
    spec: PlanSpec, plan_id: str, outcomes: Sequence[Outcome], recs: Sequence[Recommendation]
) -> list[tuple]:
    """Rows of the plan table (its data schema: every column but run_id)."""
    chosen = {(r.group, r.point): r for r in recs if r.found}
    settings = {p.number: p.setting_values() for p in spec.points}
    names = [f.name for f in data_schema(PLAN).fields]
    rows = []
    for o in outcomes:
        rec = chosen.get((o.group, o.point))
        targets = {t.column: t.limit for t in spec.targets if t.applies_to(o.group)}
        targets.update({t.column: t.limit for t in spec.targets if t.group == o.group})
        values = {
            "point": o.point,
            "point_run_id": point_run_id(plan_id, o.point),
            "group": o.group,
            "settings_json": json.dumps(settings[o.point], sort_keys=True),
            "instances": o.instances,
            "threads": o.threads,
            "pool": o.pool,
            **{column: o.metrics.get(column) for column in SUMMARY_COLUMNS},
            "max_oldest_ready_age_ms": o.metrics.get("max_oldest_ready_age_ms"),
            "busiest_instance_utilization": o.metrics.get("busiest_instance_utilization"),
            "idle_instances": o.metrics.get("idle_instances"),
            "targets_json": json.dumps(targets, sort_keys=True),
            "meets_targets": o.meets if spec.targets else None,
            "failed_targets": ",".join(t.metric for t in o.failed) or None,
            "recommended": rec is not None,
            "binding_target": (",".join(t.metric for t in rec.binding) or "none") if rec else None,
        }
        rows.append(tuple(_typed(values[name], PLAN[name].dataType) for name in names))
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
        spark.createDataFrame(rows, data_schema(PLAN)).coalesce(1).write.parquet(staging)
        sink.publish(spark, output, "plan", staging, plan_id)
    finally:
        remove_tree(staging)
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
    lines = [f"plan {result.plan_id}: {len(spec.points)} points in {result.elapsed_s:.0f}s"]
    lines.append("targets: " + ("; ".join(map(str, spec.targets)) or "none given"))
    chosen = {(r.group, r.point) for r in result.recommendations if r.found}
    for group in dict.fromkeys(o.group for o in result.outcomes):
        lines.append(f"group {group}")
        table = [["point", "case", "pool", *(c[0] for c in _COLUMNS), "targets"]]
        for o in (o for o in result.outcomes if o.group == group):
            pool = "unlimited" if o.pool is None else f"{o.instances}x{o.threads}={o.pool}"
            verdict = (
                "-"
                if not spec.targets
                else ("met" if o.meets else "missed: " + ",".join(t.metric for t in o.failed))
            )
            if (group, o.point) in chosen:
                verdict += "  <- recommended"
            case = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in o.case) or "-"
            table.append(
                [
                    f"p{o.point}",
                    case,
                    pool,
                    *(show(kind, o.metrics.get(col)) for _, col, kind in _COLUMNS),
                    verdict,
                ]
            )
        lines += _aligned(table)
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


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]
