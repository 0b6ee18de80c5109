"""``retrysim digest``: each table's row count and content digest for one run."""

from __future__ import annotations

import argparse
import os

from deltalake import DeltaTable

from retrysim.checks.run_digest import format_digests, table_digests
from retrysim.scenario.errors import ScenarioError
from retrysim.session import build_session, stop_session
from retrysim.store.sinks import table_path


def add_digest_command(commands: argparse._SubParsersAction) -> None:
    """``retrysim digest --output DIR --run-id ID`` (wired into retrysim.cli)."""
    command = commands.add_parser(
        "digest",
        help="print each table's row count and content digest for one run",
        description="Print, per table, the run's row count and an order-independent digest "
        "of its rows (run-specific columns excluded); two runs with equal lines produced "
        "the same results.",
    )
    command.add_argument("--output", required=True, help="folder of the Delta tables")
    command.add_argument("--run-id", required=True, help="the run to digest")


def digest_command(args: argparse.Namespace) -> int:
    output = os.path.abspath(args.output)
    runs = table_path(output, "runs")
    if not DeltaTable.is_deltatable(runs):
        raise ScenarioError("--output", f"no retrysim tables in {output} (no Delta table {runs})")
    spark = build_session("retrysim:digest", conf={"spark.ui.enabled": "false"})
    try:
        digests = table_digests(spark, output, args.run_id)
    finally:
        stop_session(spark)
    if digests["runs"][0] == 0:
        raise ScenarioError("--run-id", f"no run {args.run_id!r} in {runs}")
    print(format_digests(digests), flush=True)
    return 0
