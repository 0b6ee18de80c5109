"""``retrysim plan`` (also ``jobs/capacity_plan.py``): a sweep, its plan table and report."""

from __future__ import annotations

import argparse
import os

from retrysim.cli.common import (
    add_replications_option,
    add_scenario_options,
    check_output,
    check_spark,
    say,
)
from retrysim.engine.sizing import check_size
from retrysim.planning.plan import (
    default_plan_id,
    format_plan,
    plan_execution,
    point_run_id,
    prepare_plan,
    run_plan,
)
from retrysim.planning.replications import DEFAULT_CONFIDENCE
from retrysim.planning.sweep import point_scenario
from retrysim.planning.targets import METRICS
from retrysim.reporting.report import write_plan_report
from retrysim.session import build_session, stop_session


def add_plan_command(commands: argparse._SubParsersAction) -> None:
    """``retrysim plan`` (wired into retrysim.cli; also jobs/capacity_plan.py)."""
    command = commands.add_parser(
        "plan",
        help="sweep scenario keys and recommend the smallest consumer pool meeting targets",
        description="Run the scenario once per point of a sweep grid, write the plan table, "
        "and recommend per group the smallest consumer pool (instances x threads) that "
        "meets every --target, naming the binding target.",
    )
    add_scenario_options(command, "override a scenario key for every point")
    command.add_argument(
        "--sweep",
        dest="sweeps",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="sweep a scenario key over values (repeat for a cartesian grid), e.g. "
        "groups.order-service.consumers.instances=2,4,8; a group key without 'groups.<name>.' "
        "(consumers.instances=2,4,8) is accepted when the scenario has exactly one group",
    )
    command.add_argument(
        "--search",
        metavar="KEY=LO..HI",
        help="find the smallest value of a group's consumers.instances or consumers.threads "
        "in LO..HI that meets the targets, by bisection (about 2 + log2(HI-LO) points); "
        "other --sweep keys make cases, each searched",
    )
    command.add_argument(
        "--target",
        dest="targets",
        action="append",
        default=[],
        metavar="[GROUP.]METRIC=LIMIT",
        help=f"an upper bound every group (or GROUP) must meet; metrics: {', '.join(METRICS)} "
        "(durations like 5m, counts, peak_utilization as 0.8 or 80%%)",
    )
    command.add_argument("--plan-id", help="plan id (default: <name>-plan-<UTC time>-<random>)")
    command.add_argument(
        "--replace",
        action="store_true",
        help="run a plan id the folder already holds again, in its place: the new runs are "
        "published, then the earlier ones removed (without it such a plan id is refused)",
    )
    command.add_argument(
        "--delta-sink",
        choices=("auto", "delta-rs", "delta-spark"),
        default="auto",
        help="as for simulate",
    )
    command.add_argument(
        "--force", action="store_true", help="run even when a point's size estimate cannot fit"
    )
    command.add_argument("--quiet", action="store_true", help="one progress line per point only")
    command.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    add_replications_option(command)
    command.add_argument(
        "--confidence",
        type=_share,
        default=DEFAULT_CONFIDENCE,
        metavar="C",
        help="recommend the smallest pool whose share of replications meeting every target "
        "is at least C (0 < C <= 1, or a percentage; default 0.95)",
    )


def _share(text: str) -> float:
    """An argparse type: 0.95 or 95%%; argparse reports the option and exits with code 2."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"value {text!r}: must be within (0, 1] or (0%, 100%]")
    return value


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
    spark = build_session(f"retrysim:plan:{spec.base.name}", args.master, light_jit=True)
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
