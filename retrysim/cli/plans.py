"""``retrysim plans list | show | delete``: the capacity plans under an output folder.

``list`` and ``show`` read with delta-rs on the driver, no Spark. ``delete`` removes the
plan's rows and all its runs together, one commit a table, through delta-spark where it is
the sink, else with delta-rs, as ``retrysim runs delete`` does
(:mod:`retrysim.planning.plans`).
"""

from __future__ import annotations

import argparse
import json
import os

from deltalake import DeltaTable

from retrysim.cli.common import EXIT_OK, add_actions, add_committing_sink, say
from retrysim.cli.runs import committing_session, shown
from retrysim.planning.plans import PlanInfo, delete_plan, find_plan, list_plans, plan_rows
from retrysim.planning.targets import aligned, show
from retrysim.scenario.errors import ScenarioError
from retrysim.store.sinks import table_path


def add_plans_command(commands: argparse._SubParsersAction) -> None:
    actions = add_actions(
        commands,
        "plans",
        "list, show or delete the capacity plans of a folder",
        {
            "list": "every plan: id, scenario, points, runs, when and status",
            "show": "one plan: its settings, points, runs and recommendation",
            "delete": "delete a plan's rows and all its runs (one commit a table)",
        },
    )
    for name in ("show", "delete"):
        actions[name].add_argument("--plan-id", required=True, help="the plan")
    add_committing_sink(actions["delete"])


def plans_command(args: argparse.Namespace) -> int:
    output = os.path.abspath(args.output)
    if not DeltaTable.is_deltatable(table_path(output, "runs")):
        raise ScenarioError("--output", f"no retrysim tables in {output} (no runs table)")
    if args.action == "list":
        plans = list_plans(output)
        print(_table(plans) if plans else f"no plans in {output}", flush=True)
    elif args.action == "show":
        print(_shown_plan(output, find_plan(output, args.plan_id)), flush=True)
    else:
        plan = find_plan(output, args.plan_id)  # before a Spark session starts for nothing
        removed = delete_plan(output, plan.plan_id, say, committing_session(args))
        say(f"plan {plan.plan_id}: {len(plan.runs)} runs deleted from {', '.join(removed)}")
    return EXIT_OK


_COLUMNS = ("plan_id", "scenario", "points", "runs", "started_at", "status")


def _table(plans: list[PlanInfo]) -> str:
    rows = [
        [plan.plan_id, shown(plan.scenario), str(plan.points), str(len(plan.runs)),
         shown(plan.started_at), plan.status]
        for plan in plans
    ]  # fmt: skip
    return "\n".join(line[2:].rstrip() for line in aligned([list(_COLUMNS), *rows]))


def _shown_plan(output: str, plan: PlanInfo) -> str:
    """The plan's summary, its settings (targets, replications, confidence), each point and
    group with its pool and verdict, its runs and the recommendation."""
    rows = plan_rows(output, plan.plan_id)
    lines = [
        f"plan_id: {plan.plan_id}",
        f"status: {plan.status}",
        f"scenario: {shown(plan.scenario)}",
        f"started_at: {shown(plan.started_at)}",
        f"execution: {plan.execution}",
        f"points: {plan.points}",
    ]
    if rows:
        first = rows[0]
        lines.append(f"replications: {first['replications']}")
        lines.append(f"confidence: {shown(first['confidence'])}")
        targets = {row["group"]: row["targets_json"] for row in rows}
        for group, limits in targets.items():
            lines.append(f"targets of {group}: {limits}")
        table = [["point", "group", "settings", "pool", "p99 commit", "max Ready", "verdict",
                  "run"]]  # fmt: skip
        for row in rows:
            pool = "unlimited" if row["pool"] is None else (
                f"{row['instances']}x{row['threads']}={row['pool']}")  # fmt: skip
            table.append(
                [
                    f"p{row['point']}",
                    row["group"],
                    ",".join(f"{k}={v}" for k, v in json.loads(row["settings_json"]).items())
                    or "-",
                    pool,
                    show("duration", row["p99_time_to_commit_ms"]),
                    show("count", row["max_ready_backlog"]),
                    _verdict(row),
                    row["point_run_id"],
                ]
            )
        lines += ["points and groups:", *aligned(table)]
    lines.append("runs:")
    named = set(plan.named)
    for run in plan.runs:
        mark = "" if run.run_id in named or not named else "  (an earlier execution's)"
        lines.append(f"  {run.run_id}  {run.status}{mark}")
    chosen = [row for row in rows if row["recommended"]]
    if not rows:
        lines.append("recommendation: none (no plan rows: its execution did not finish)")
    elif not chosen:
        lines.append("recommendation: none (no targets, or no point meets them)")
    else:
        lines.append("recommendation:")
        for row in chosen:
            lines.append(
                f"  group {row['group']}: point p{row['point']} ({row['instances']}x"
                f"{row['threads']}={row['pool']}), run {row['point_run_id']}, binding "
                f"{row['binding_target']}"
            )
    return "\n".join(lines)


def _verdict(row: dict) -> str:
    if row["meets_targets"] is None:
        return "-"
    verdict = "met" if row["meets_targets"] else f"missed: {row['failed_targets']}"
    return verdict + ("  <- recommended" if row["recommended"] else "")
