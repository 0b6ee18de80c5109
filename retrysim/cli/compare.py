"""``retrysim compare``: a run laid over a group's exported metrics, with the error per
series, kept as the ``comparison`` and ``observed`` tables beside the run."""

from __future__ import annotations

import argparse
import os
import shutil
import uuid

from deltalake import DeltaTable

from retrysim.cli.common import add_metrics_arguments, check_spark, say
from retrysim.metrics.compare import HEADER, aligned, describe, errors, run_clock, simulated
from retrysim.metrics.reading import MetricsError, observe, read_exports
from retrysim.scenario.errors import ScenarioError
from retrysim.session import build_session, stop_session
from retrysim.store.sinks import choose_sink, table_path
from retrysim.tables.schemas import COMPARISON, OBSERVED, data_schema, write_rows


def add_compare_command(commands: argparse._SubParsersAction) -> None:
    """``retrysim compare --metrics FILE... --run RUN_ID [--output DIR]``."""
    command = commands.add_parser(
        "compare",
        help="lay a run over a group's exported metrics and print the error per series",
        description="Read RocketMQ metrics exported from Prometheus (range-query JSON) or "
        "Grafana (CSV), lay the run over them on its clock (its scenario's start_at) and "
        "print, per series, the normalized mean absolute error and the peaks' difference in "
        "size and time. The comparison is kept in DIR as the Delta tables comparison and "
        "observed; the run's report (retrysim report) then draws observed against simulated.",
    )
    add_metrics_arguments(
        command, "the group to compare (default: the run's only group)", group_required=False
    )
    command.add_argument("--run", "--run-id", dest="run_id", required=True, help="the run")
    command.add_argument("--output", default="out", help="folder of the Delta tables, where "
                         "the run is and the comparison goes (default: out)")  # fmt: skip
    command.add_argument("--master", help="Spark master (default: local)")


def compare_command(args: argparse.Namespace) -> int:
    output = os.path.abspath(args.output)
    if not DeltaTable.is_deltatable(table_path(output, "runs")):
        raise ScenarioError("--output", f"no retrysim tables in {output} (no runs table)")
    try:
        start_at, scenario = run_clock(output, args.run_id)
    except MetricsError as error:
        raise ScenarioError("--run", str(error)) from None
    groups = [g.name for g in scenario.groups]
    group = args.group or (groups[0] if len(groups) == 1 else None)
    if group not in groups:
        said = f"value {args.group!r}" if args.group else "required: the run has several groups"
        raise ScenarioError("--group", f"{said}; the run's groups are {', '.join(groups)}")
    try:
        observed = observe(read_exports(args.metrics), group, args.topic)
    except MetricsError as error:
        raise ScenarioError("--metrics", str(error)) from None
    check_spark(args.master)
    spark = build_session(
        "retrysim:compare", args.master, conf={"spark.ui.enabled": "false"}, light_jit=True
    )
    try:
        points = aligned(observed, simulated(spark, output, args.run_id, scenario, group), start_at)
        found = errors(points, observed)
        if not found:
            raise ScenarioError("--metrics", f"no sample falls in run {args.run_id}'s span "
                                f"({start_at.isoformat()} on)")  # fmt: skip
        _publish(spark, output, args.run_id, group, found, points)
    finally:
        stop_session(spark)
    print(f"run {args.run_id}, group {group}, against {observed.family} metrics "
          f"({len(args.metrics)} file(s)):")  # fmt: skip
    print(HEADER)
    for error in found:
        print(describe(error))
    say(f"comparison kept in {table_path(output, 'comparison')} and observed; "
        f"retrysim report --output {args.output} --run-id {args.run_id} draws it")  # fmt: skip
    return 0


def _publish(spark, output: str, run_id: str, group: str, found, points) -> None:
    """The two tables, staged then published for the run (replacing an earlier comparison)."""
    rows = [(group, e.quantity, e.series, e.points, e.nmae, e.observed_peak, e.simulated_peak,
             e.peak_error, e.observed_peak_at.to_pydatetime(),
             e.simulated_peak_at.to_pydatetime(), e.peak_shift_s) for e in found]  # fmt: skip
    samples = [(group, r.quantity, r.at.to_pydatetime(), int(r.bucket_start_ms), float(r.observed),
                float(r.simulated)) for r in points.itertuples(index=False)]  # fmt: skip
    staging = os.path.join(output, "_staging", f"compare-{run_id}-{uuid.uuid4().hex[:8]}")
    sink = choose_sink(spark)
    try:
        for table, table_rows, schema in (("observed", samples, OBSERVED),
                                          ("comparison", rows, COMPARISON)):  # fmt: skip
            staged = write_rows(table_rows, data_schema(schema), os.path.join(staging, table))
            sink.publish(spark, output, table, staged, run_id)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
