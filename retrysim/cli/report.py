"""``retrysim report``: the self-contained HTML report of a run or of a plan."""

from __future__ import annotations

import argparse
import os

from deltalake import DeltaTable

from retrysim.cli.common import check_spark
from retrysim.reporting.report import write_compare_report, write_plan_report, write_run_report
from retrysim.scenario.errors import ScenarioError
from retrysim.session import build_session, stop_session
from retrysim.store.sinks import table_path


def add_report_command(commands: argparse._SubParsersAction) -> None:
    """``retrysim report --output DIR (--run-id ID | --plan-id ID | --compare A B)`` (wired
    into retrysim.cli)."""
    command = commands.add_parser(
        "report",
        help="write the HTML report of a run or of a plan",
        description="Write DIR/reports/<id>.html: interactive charts of a run's load and "
        "summary, a plan's trade-off curves and recommendation, or two runs' series overlaid "
        "(DIR/reports/compare-<A>-<B>.html); the charts load plotly-<version>.min.js, "
        "written once beside them.",
    )
    command.add_argument("--output", required=True, help="folder of the Delta tables")
    which = command.add_mutually_exclusive_group(required=True)
    which.add_argument("--run-id", help="the run to report on")
    which.add_argument("--plan-id", help="the plan to report on")
    which.add_argument(
        "--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="overlay two runs' series"
    )
    command.add_argument("--master", help="Spark master (default: local)")


def report_command(args: argparse.Namespace) -> int:
    output = os.path.abspath(args.output)
    table = table_path(output, "plan" if args.plan_id else "runs")
    if not DeltaTable.is_deltatable(table):
        flag = "--plan-id" if args.plan_id else "--output"
        raise ScenarioError(
            flag,
            f"no retrysim {'plans' if args.plan_id else 'tables'} in "
            f"{output} (no Delta table {table})",
        )
    check_spark(args.master)
    spark = build_session(
        "retrysim:report", args.master, conf={"spark.ui.enabled": "false"}, light_jit=True
    )
    try:
        if args.plan_id:
            path = write_plan_report(spark, output, args.plan_id)
        elif args.compare:
            path = write_compare_report(spark, output, *args.compare)
        else:
            path = write_run_report(spark, output, args.run_id)
    finally:
        stop_session(spark)
    print(path, flush=True)
    return 0
