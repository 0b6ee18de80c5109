"""Command line: ``retrysim simulate`` (also ``jobs/simulate.py`` under spark-submit).

Input is validated before Spark starts, so bad input costs a second, not a JVM start:
exit code 2 with one message naming the field and what is allowed, and nothing written.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from deltalake import DeltaTable

from retrysim.config import ScenarioError, load_scenario
from retrysim.digest import add_digest_command, digest_command
from retrysim.engine import TAIL_ROWS
from retrysim.plan import add_plan_command, plan_command
from retrysim.report import add_report_command, report_command, write_run_report
from retrysim.sinks import arrow_schema, table_path
from retrysim.sizing import check_size
from retrysim.tables import ALL_SCHEMAS, TABLE_SETS
from retrysim.targets import human_ms
from retrysim.validate import ValidationError, add_validate_command, validate_command

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="retrysim", description="Simulate RocketMQ consumer retry and dead-letter flow."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    sim = commands.add_parser("simulate", help="run a scenario and write the Delta tables")
    sim.add_argument("--scenario", help="scenario YAML (default: conf/default.yaml)")
    sim.add_argument("--output", default="out", help="folder of the Delta tables (default: out)")
    sim.add_argument("--master", help="Spark master, e.g. local[2] (default: spark-submit's)")
    sim.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario key, e.g. groups.0.behavior.fail_probability=0.05",
    )
    sim.add_argument("--run-id", help="run id (default: <name>-<UTC time>-<random>)")
    sim.add_argument(
        "--delta-sink",
        choices=("auto", "delta-rs", "delta-spark"),
        default="auto",
        help="auto: delta-spark when its JARs are on the classpath, else delta-rs commits",
    )
    sim.add_argument(
        "--tables",
        choices=("full", "lean"),
        default="full",
        help="lean: skip the transitions and messages tables, derived when read (large runs)",
    )
    sim.add_argument("--quiet", action="store_true", help="no per-round progress")
    sim.add_argument(
        "--tail-rows",
        type=_non_negative,
        default=TAIL_ROWS,
        metavar="N",
        help=f"finish a retry frontier of at most N messages event by event in one stage "
        f"(default {TAIL_ROWS:,}; 0: one Spark stage per round)",
    )
    sim.add_argument(
        "--force", action="store_true", help="run even when the size estimate says it cannot fit"
    )
    sim.add_argument(
        "--no-validate",
        dest="validate",
        action="store_false",
        help="publish without checking the invariants first (`retrysim validate` can check "
        "later); for benchmarks and very large trusted runs",
    )
    sim.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    add_digest_command(commands)
    add_validate_command(commands)
    add_plan_command(commands)
    add_report_command(commands)
    return parser


def _non_negative(text: str) -> int:
    """An argparse type: argparse reports the option and exits with code 2."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"value {text!r}: must be an integer >= 0")
    return int(text)


def check_output(output: str) -> str:
    """The output folder must be a writable directory (or creatable), and any table already
    in it must have the schema this version writes."""
    path = os.path.abspath(output)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ScenarioError("--output", f"{path} is a file; give a folder for the Delta tables")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ScenarioError("--output", f"{existing} is not a writable folder")
    for table, schema in ALL_SCHEMAS.items():
        location = table_path(path, table)
        if DeltaTable.is_deltatable(location):
            found = [f.name for f in DeltaTable(location).schema().fields]
            wanted = arrow_schema(schema).names
            if found != wanted:
                raise ScenarioError(
                    "--output",
                    f"table {location} has columns {found}, this version writes {wanted}; "
                    "use another --output folder",
                )
    return path


def _say(line: str) -> None:
    print(f"retrysim: {line}", flush=True)


def _print_summary(result) -> None:
    rows = result.summary.orderBy("group").collect()
    _say(f"run {result.run_id} finished in {result.elapsed_s:.1f}s over {result.rounds} rounds")
    for row in rows:
        _say(
            f"group {row['group']}: {row['messages']:,} messages, {row['deliveries']:,} "
            f"deliveries ({row['retries']:,} retries, x{row['amplification']:.3f}), "
            f"{row['commits']:,} commits, {row['dlq']:,} DLQ, {row['discards']:,} discarded, "
            f"{row['pending']:,} pending at horizon ({row['engine']} engine)"
        )
        _say(
            f"  time to commit p50 {_ms(row['p50_time_to_commit_ms'])}, "
            f"p99 {_ms(row['p99_time_to_commit_ms'])}; time to DLQ p50 "
            f"{_ms(row['p50_time_to_dlq_ms'])}; commitlog writes {row['commitlog_writes']:,} "
            f"(x{row['write_amplification']:.3f} per message)"
        )
    written = ",".join(sorted(TABLE_SETS[result.tables], key=list(ALL_SCHEMAS).index))
    _say(f"tables ({result.sink}, {result.tables}): {result.output}/{{{written}}}")


def _ms(value: float | None) -> str:
    return "-" if value is None else human_ms(value)


def simulate_command(args: argparse.Namespace) -> int:
    from retrysim.runner import check_run_id, simulate
    from retrysim.session import build_session

    scenario = load_scenario(args.scenario, args.overrides)
    output = check_output(args.output)
    if args.run_id:
        check_run_id(args.run_id)
    check_size(scenario, output, args.master, force=args.force)
    for group in scenario.groups:
        pool = group.consumers.pool_size
        threads = (
            "unlimited consumer threads"
            if pool is None
            else f"{group.consumers.instances} x {group.consumers.threads} = {pool:,} "
            "consumer threads"
        )
        _say(f"group {group.name}: {group.flavor}, {group.workload.messages:,} messages, {threads}")
    spark = build_session(f"retrysim:{scenario.name}", args.master)
    try:
        result = simulate(
            spark,
            scenario,
            output=output,
            run_id=args.run_id,
            progress=None if args.quiet else _say,
            sink=args.delta_sink,
            tables=args.tables,
            tail_rows=args.tail_rows,
            validate=args.validate,
        )
        _print_summary(result)
        if not args.no_report:
            report = write_run_report(spark, output, result.run_id, retries=result.retries)
            _say(f"report: {report}")
    finally:
        spark.stop()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "simulate":
            return simulate_command(args)
        if args.command == "digest":
            return digest_command(args)
        if args.command == "validate":
            return validate_command(args)
        if args.command in ("plan", "report"):
            return {"plan": plan_command, "report": report_command}[args.command](args)
    except ScenarioError as error:
        print(f"retrysim: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ValidationError as error:
        print(f"retrysim: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
