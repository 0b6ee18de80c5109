"""``retrysim simulate`` (also ``jobs/simulate.py``): one run, its summary and report.

Input is validated before Spark starts, so bad input is reported without a JVM start.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys

from deltalake.exceptions import DeltaError

from retrysim.cli.common import EXIT_OK, check_output, check_spark, load_note, logs_to_file, say
from retrysim.engine.choice import planned_engines
from retrysim.engine.event_stage import ENGINE_SEQUENTIAL
from retrysim.engine.sizing import (
    GroupEstimate,
    check_size,
    estimate_seconds,
    human_bytes,
)
from retrysim.planning.replications import Replications, check_replications, replicate
from retrysim.planning.targets import aligned, show
from retrysim.reporting.report import draw_run_report
from retrysim.reporting.verdict import run_verdicts
from retrysim.runner import check_run_id, default_run_id
from retrysim.scenario.loading import load_scenario
from retrysim.scenario.units import human_ms
from retrysim.session import build_session, stop_session
from retrysim.store.sinks import run_rows
from retrysim.tables.schemas import ALL_SCHEMAS, TABLE_SETS


def print_summary(result, as_json: list[dict] | None = None) -> None:
    """A finished run's figures and each group's verdict (retrysim.reporting.verdict); with
    ``as_json``, the same run as a dict appended to it, printed by the command at its end."""
    try:
        rows = run_rows(result.output, "summary", result.run_id)
        verdicts = run_verdicts(result.output, result.run_id)
    except DeltaError:  # a table feature delta-rs cannot read (delta-spark's sink): Spark's
        rows = [row.asDict() for row in result.summary.collect()]
        verdicts = run_verdicts(
            result.output, result.run_id, lambda table: result.table(table).toPandas()
        )
    rows.sort(key=lambda row: row["group"])
    by_group = {verdict.group: verdict for verdict in verdicts}
    say(f"run {result.run_id} finished in {result.elapsed_s:.1f}s over {result.rounds} rounds")
    for row in rows:
        say(
            f"group {row['group']}: {row['messages']:,} messages, {row['deliveries']:,} "
            f"deliveries ({row['retries']:,} retries, x{row['amplification']:.3f}), "
            f"{row['commits']:,} commits, {row['dlq']:,} DLQ, {row['replayed']:,} replayed, "
            f"{row['discards']:,} discarded, {row['pending']:,} pending at horizon "
            f"({row['engine']} engine)"
        )
        say(
            f"  time to commit p50 {_ms(row['p50_time_to_commit_ms'])}, "
            f"p99 {_ms(row['p99_time_to_commit_ms'])}; time to DLQ p50 "
            f"{_ms(row['p50_time_to_dlq_ms'])}; commitlog writes {row['commitlog_writes']:,} "
            f"(x{row['write_amplification']:.3f} per message)"
        )
        if row["group"] in by_group:
            say(f"  verdict: {'; '.join(by_group[row['group']].lines)}")
    written = ",".join(sorted(TABLE_SETS[result.tables], key=list(ALL_SCHEMAS).index))
    say(f"tables ({result.sink}, {result.tables}): {result.output}/{{{written}}}")
    if result.report:
        say(f"report: {result.report}")
    if as_json is not None:
        as_json.append(
            {
                "run_id": result.run_id,
                "output": result.output,
                "elapsed_s": round(result.elapsed_s, 3),
                "report": result.report,
                "groups": [
                    {"group": v.group, "verdict": v.lines, "figures": v.figures} for v in verdicts
                ],
            }
        )


def _ms(value: float | None) -> str:
    return "-" if value is None else human_ms(value)


# What the command prints across replications: (label, summary column, kind).
_ACROSS = (
    ("deliveries", "deliveries", "count"),
    ("retries", "retries", "count"),
    ("DLQ", "dlq", "count"),
    ("pending", "pending", "count"),
    ("p50 time to commit", "p50_time_to_commit_ms", "duration"),
    ("p99 time to commit", "p99_time_to_commit_ms", "duration"),
    ("p99 time to DLQ", "p99_time_to_dlq_ms", "duration"),
    ("max Ready backlog", "max_ready_backlog", "count"),
    ("max WaitingRetry", "max_waiting_retry", "count"),
    ("oldest Ready", "max_oldest_ready_age_ms", "duration"),
    ("peak utilization", "peak_utilization", "fraction"),
    ("busiest instance", "busiest_instance_utilization", "fraction"),
    ("write amplification", "write_amplification", "ratio"),
)


def _print_intervals(reps: Replications) -> None:
    frame = reps.intervals().set_index(["group", "metric"])
    say(
        f"{len(reps.results)} replications of {reps.run_id} in {reps.elapsed_s:.1f}s: mean, "
        "95% interval of the mean, min..max"
    )
    for group in dict.fromkeys(frame.index.get_level_values("group")):
        say(f"group {group}")
        table = []
        for label, column, kind in _ACROSS:
            row = frame.loc[(group, column)]
            values = [row["mean"], row["ci_low"], row["ci_high"], row["min"], row["max"]]
            mean, low, high, least, most = (None if v != v else v for v in values)
            shown = [label, show(kind, mean), f"[{show(kind, low)}, {show(kind, high)}]"]
            shown.append(f"{show(kind, least)}..{show(kind, most)}")
            if row["missing"]:
                shown[-1] += f" (no value in {int(row['missing'])})"
            table.append(shown)
        for line in aligned(table):
            say(line)


def _dry_run(scenario, sizes: list[GroupEstimate], args: argparse.Namespace) -> int:
    """What the run would do, from the scenario alone: each group's engine (and why), its
    expected deliveries and disk, and a time estimate; no Spark, nothing written."""
    say(f"dry run of {scenario.name}: nothing is simulated or written")
    engines = planned_engines(scenario, say)
    for size in sizes:
        engine = engines[size.name]
        how = "event by event" if engine == ENGINE_SEQUENTIAL else "by rounds (event by event "
        how += "" if engine == ENGINE_SEQUENTIAL else "if a pool turns out full)"
        say(
            f"group {size.name}: engine {engine} ({how}); about {size.deliveries:,.0f} "
            f"deliveries (x{size.per_message:.2f} per message), {human_bytes(size.disk_bytes)} "
            "of disk"
        )
    seconds = estimate_seconds(sizes, engines, not args.no_report, args.replications)
    disk = args.replications * sum(size.disk_bytes for size in sizes)
    now = load_note(seconds, args.master)
    say(
        f"estimate: about {human_bytes(disk)} of disk at {args.output}, about {seconds:.0f} s "
        f"launch to exit on a quiet 2-core machine{now}"
    )
    return EXIT_OK


def simulate_command(args: argparse.Namespace) -> int:
    if not args.json:
        return _simulate(args, None)
    documents: list[dict] = []
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON document only
        code = _simulate(args, documents)
    print(json.dumps({"runs": documents}, indent=1), flush=True)
    return code


def _simulate(args: argparse.Namespace, documents: list[dict] | None) -> int:
    scenario = load_scenario(args.scenario, args.overrides)
    output = check_output(args.output)
    run_id = check_run_id(args.run_id or default_run_id(scenario))
    check_replications(args.replications, run_id)
    sizes = check_size(scenario, output, args.master, force=args.force, runs=args.replications)
    if args.dry_run:
        return _dry_run(scenario, sizes, args)
    check_spark(args.master, args.delta_sink)
    for group in scenario.groups:
        pool = group.consumers.pool_size
        threads = (
            "unlimited consumer threads"
            if pool is None
            else f"{group.consumers.instances} x {group.consumers.threads} = {pool:,} "
            "consumer threads"
        )
        say(f"group {group.name}: {group.flavor}, {group.workload.messages:,} messages, {threads}")
    log = logs_to_file(output, "simulate")
    spark = build_session(f"retrysim:{scenario.name}", args.master, light_jit=True, log_file=log)
    try:
        reps = replicate(
            spark,
            scenario,
            args.replications,
            output=output,
            run_id=run_id,
            progress=None if args.quiet else say,
            on_result=lambda _k, result: print_summary(result, documents),
            sink=args.delta_sink,
            tables=args.tables,
            tail_rows=args.tail_rows,
            validate=args.validate,
            report=None if args.no_report else functools.partial(draw_run_report, output),
        )
        if args.replications > 1:
            _print_intervals(reps)
    finally:
        stop_session(spark)
    return EXIT_OK
