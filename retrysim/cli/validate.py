"""``retrysim validate``: recover an output folder, then check its runs' invariants."""

from __future__ import annotations

import argparse
import os

from retrysim.checks.validate import validate_output
from retrysim.cli.common import say
from retrysim.scenario.errors import ScenarioError
from retrysim.session import build_session, stop_session
from retrysim.store.recovery import recover
from retrysim.store.sinks import complete_run_ids, table_path


def add_validate_command(commands: argparse._SubParsersAction) -> None:
    """``retrysim validate --output DIR [--run-id ID]`` (wired into retrysim.cli)."""
    command = commands.add_parser(
        "validate",
        help="check the invariants of the runs in an output folder",
        description="Remove what writers that died left behind, then check the tables of "
        "every complete run (or of one) against the model's invariants. Exit code 1 when an "
        "invariant is broken.",
    )
    command.add_argument("--output", required=True, help="folder of the Delta tables")
    command.add_argument("--run-id", help="the run to check (default: every complete run)")


def validate_command(args: argparse.Namespace) -> int:
    output = os.path.abspath(args.output)
    runs = table_path(output, "runs")
    if not os.path.isdir(runs):
        raise ScenarioError("--output", f"no retrysim tables in {output} (no table {runs})")

    recover(output, say)
    complete = complete_run_ids(output)
    if args.run_id is not None and args.run_id not in complete:
        listed = ", ".join(complete) or "none"
        raise ScenarioError("--run-id", f"no complete run {args.run_id!r} in {runs} ({listed})")
    chosen = [args.run_id] if args.run_id else complete
    say(f"validating {len(chosen)} run(s) in {output}: {', '.join(chosen) or '-'}")
    spark = build_session("retrysim:validate", conf={"spark.ui.enabled": "false"})
    try:
        report = validate_output(spark, output, args.run_id)
    finally:
        stop_session(spark)
    print(report.format(), flush=True)
    broken = len(report.broken)
    say(f"{broken} invariant(s) broken" if broken else "all invariants hold")
    return 1 if broken else 0
