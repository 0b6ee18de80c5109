"""``retrysim export``: a run's load series under RocketMQ 5.x's metric names, as OpenMetrics
text for Prometheus (docs/metrics.md)."""

from __future__ import annotations

import argparse
import datetime as dt
import os

from deltalake import DeltaTable
from pydantic import TypeAdapter, ValidationError

from retrysim.cli.common import check_spark
from retrysim.metrics.export import FORMATS, OPENMETRICS, export_openmetrics, run_clock
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.spec import StartAt
from retrysim.session import build_session, stop_session
from retrysim.store.sinks import table_path


def add_export_command(commands: argparse._SubParsersAction) -> None:
    """``retrysim export --output DIR --run-id ID [--format openmetrics] [--file FILE]
    [--start-at TIME] [--cluster NAME]`` (wired into retrysim.cli)."""
    command = commands.add_parser(
        "export",
        help="write a run's load series as RocketMQ 5.x metrics (OpenMetrics text)",
        description="Write a run's load and instance_load series under RocketMQ 5.x's metric "
        "names as OpenMetrics text, one sample per load bucket at the bucket's end on the "
        "run's clock (its scenario's start_at, or --start-at), for promtool tsdb "
        "create-blocks-from openmetrics (default file: DIR/exports/<run-id>.om.txt).",
    )
    command.add_argument("--output", required=True, help="folder of the Delta tables")
    command.add_argument("--run-id", "--run", dest="run_id", required=True, help="the run")
    command.add_argument("--format", choices=FORMATS, default=OPENMETRICS, help="the file's format")
    command.add_argument("--file", help="the file to write (default DIR/exports/<run-id>.om.txt)")
    command.add_argument(
        "--start-at",
        help="the moment (ISO 8601, UTC unless it says) the run's time 0 stands for; "
        "default: the scenario's start_at (required when it gave none)",
    )
    command.add_argument(
        "--cluster", help="the cluster label of every series (default: the run id)"
    )
    command.add_argument("--master", help="Spark master (default: local)")


def _start_at(text: str | None) -> dt.datetime | None:
    if text is None:
        return None
    try:
        return TypeAdapter(StartAt).validate_python(text)
    except ValidationError as error:
        reason = error.errors()[0]["msg"].removeprefix("Value error, ")
        raise ScenarioError("--start-at", f"value {text!r}: {reason}") from None


def export_command(args: argparse.Namespace) -> int:
    output = os.path.abspath(args.output)
    runs = table_path(output, "runs")
    if not DeltaTable.is_deltatable(runs):
        raise ScenarioError("--output", f"no retrysim tables in {output} (no Delta table {runs})")
    start_at = _start_at(args.start_at)
    run_clock(output, args.run_id, start_at)  # no such run, or no clock: one line, no JVM
    check_spark(args.master)
    spark = build_session(
        "retrysim:export", args.master, conf={"spark.ui.enabled": "false"}, light_jit=True
    )
    try:
        done = export_openmetrics(spark, output, args.run_id, args.file, start_at, args.cluster)
    finally:
        stop_session(spark)
    print(
        f"retrysim: {done.series} series, {done.samples} samples from "
        f"{done.start_at.isoformat()}: {done.path}",
        flush=True,
    )
    return 0
