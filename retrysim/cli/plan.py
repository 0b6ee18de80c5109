"""``retrysim plan`` (also ``jobs/capacity_plan.py``): a sweep, its plan table and report."""

from __future__ import annotations

import argparse
import os

from retrysim.cli.common import check_output, check_spark, logs_to_file, say
from retrysim.engine.sizing import check_size
from retrysim.planning.plan import (
    default_plan_id,
    format_plan,
    plan_execution,
    point_run_id,
    prepare_plan,
    run_plan,
)
from retrysim.planning.sweep import point_scenario
from retrysim.reporting.report import write_plan_report
from retrysim.session import build_session, stop_session


def plan_command(args: argparse.Namespace) -> int:
    spec = prepare_plan(
        args.scenario,
        args.overrides,
        args.sweeps,
        args.targets,
        args.replications,
        args.confidence,
        args.search,
    )
    output = check_output(args.output)
    plan_id = args.plan_id or default_plan_id(spec.base)
    execution = plan_execution(output, plan_id, spec, args.replace)
    for point in spec.points:  # each point's tables stay, so each must fit on its own
        check_size(point.scenario, output, args.master, force=args.force, runs=spec.replications)
    if spec.search is not None:  # a search probes up to the range's largest pool
        for value in (spec.search.low, spec.search.high):
            scenario = point_scenario(spec.data, {spec.search.key: str(value)})
            check_size(scenario, output, args.master, force=args.force, runs=spec.replications)
    check_spark(args.master, args.delta_sink)

    suffix = "-r<k>" if spec.replications > 1 else ""
    each = f", {spec.replications} replications each" if spec.replications > 1 else ""
    most = "at most " if spec.search is not None else ""
    say(
        f"plan {plan_id}: {most}{spec.most_points} points of {spec.base.name}{each}, runs "
        f"{point_run_id(plan_id, 1, execution)}{suffix} .. "
        f"{point_run_id(plan_id, spec.most_points, execution)}{suffix}"
        + (" (then its earlier runs are removed)" if execution > 1 else "")
    )
    log = logs_to_file(output, "plan")
    spark = build_session(
        f"retrysim:plan:{spec.base.name}", args.master, light_jit=True, log_file=log
    )
    try:
        result = run_plan(
            spark, spec, output, plan_id, say, args.delta_sink, not args.quiet,
            replace=args.replace,
        )  # fmt: skip
        print(format_plan(result), flush=True)
        say(f"plan table: {os.path.join(output, 'plan')} (run_id = {plan_id})")
        if not args.no_report:
            say(f"report: {write_plan_report(spark, output, plan_id)}")
    finally:
        stop_session(spark)
    return 0
