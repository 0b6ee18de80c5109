"""``retrysim plan`` (also ``jobs/capacity_plan.py``): a sweep, its plan table and report."""

from __future__ import annotations

import argparse
import os

from retrysim.cli.common import EXIT_OK, check_output, check_spark, load_note, logs_to_file, say
from retrysim.engine.choice import planned_engines
from retrysim.engine.sizing import (
    REPORT_S,
    RUN_FIXED_S,
    GroupEstimate,
    check_size,
    estimate_seconds,
)
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
from retrysim.scenario.spec import Scenario
from retrysim.session import build_session, stop_session


def _dry_run(spec, sized: list[tuple[str, Scenario, list[GroupEstimate]]], args) -> int:
    """Each point's engines, deliveries and time (a search: its range's two ends), and the
    plan's: no Spark, nothing written. The points run together, so the plan takes less."""
    say(f"dry run of a plan of {spec.base.name}: nothing is simulated or written")
    each = []
    for label, scenario, sizes in sized:
        engines = planned_engines(scenario, lambda _line: None)
        seconds = estimate_seconds(sizes, engines, False, spec.replications, fixed=False)
        each.append(seconds)
        groups = "; ".join(
            f"group {size.name} {engines[size.name]}, about {size.deliveries:,.0f} deliveries"
            for size in sizes
        )
        say(f"{label}: {groups}; about {seconds:.0f} s")
    points = spec.most_points if spec.search is not None else len(each)
    total = RUN_FIXED_S + sum(each) / len(each) * points + (0 if args.no_report else REPORT_S)
    now = load_note(total, args.master)
    say(
        f"estimate: {'at most ' if spec.search is not None else ''}{points} points, about "
        f"{total:.0f} s launch to exit on a quiet 2-core machine{now}"
    )
    return EXIT_OK


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
    sized = []
    for point in spec.points:  # each point's tables stay, so each must fit on its own
        sizes = check_size(
            point.scenario, output, args.master, force=args.force, runs=spec.replications
        )
        settings = ", ".join(f"{key}={value}" for key, value in point.settings.items())
        sized.append((f"point {point.number} ({settings})", point.scenario, sizes))
    if spec.search is not None:  # a search probes up to the range's largest pool
        sized = []
        for value in (spec.search.low, spec.search.high):
            scenario = point_scenario(spec.data, {spec.search.key: str(value)})
            sizes = check_size(
                scenario, output, args.master, force=args.force, runs=spec.replications
            )
            sized.append((f"{spec.search.key}={value}", scenario, sizes))
    if args.dry_run:
        return _dry_run(spec, sized, args)
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
