"""``retrysim runs list | show | delete | vacuum | optimize``: the runs under an output folder.

``list`` (filtered by scenario, plan or status) and ``show`` (every column of the run's
``runs`` row) read with delta-rs on the driver, no Spark. ``delete``, ``vacuum`` and
``optimize`` commit through delta-spark where it is the sink (``--delta-sink auto``: its
JARs are there), in a local Spark session of their own, else with delta-rs
(:mod:`retrysim.store.runs`).
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap

from deltalake import DeltaTable
from pyspark import SparkConf
from pyspark.sql import SparkSession

from retrysim.cli.common import EXIT_OK, add_actions, add_committing_sink, check_spark, say
from retrysim.planning.plans import plan_of
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.units import parse_duration
from retrysim.session import build_session, delta_jars_configured
from retrysim.store.runs import (
    DEFAULT_RETENTION_HOURS,
    STATUS_WRITING,
    RunInfo,
    delete_run,
    find_run,
    list_runs,
    optimize,
    run_rows_by_id,
    vacuum,
)
from retrysim.store.sinks import STATUS_COMPLETE, STATUS_PUBLISHING, table_path
from retrysim.tables.schemas import RUNS


def add_runs_command(commands: argparse._SubParsersAction) -> None:
    actions = add_actions(
        commands,
        "runs",
        "list, show, delete, vacuum or optimize the runs of a folder",
        {
            "list": "every run: status, scenario, sizes and times",
            "show": "one run: every column of its runs row, then its sizes and files",
            "delete": "delete a run from every table (readers stop seeing it at once)",
            "vacuum": "remove the files no table version within the retention needs",
            "optimize": "compact each run's files (one a table and run), optionally Z-ordered",
        },
    )
    for name, action in actions.items():
        if name in ("show", "delete"):
            action.add_argument("--run-id", required=True, help="the run")
        if name in COMMITTING:
            add_committing_sink(action)
    list_command = actions["list"]
    list_command.add_argument("--scenario", help="only the runs of this scenario (its name)")
    list_command.add_argument("--plan-id", help="only the runs of this plan (every execution)")
    list_command.add_argument(
        "--status",
        choices=(STATUS_COMPLETE, STATUS_PUBLISHING, STATUS_WRITING),
        help="only the runs in this state",
    )
    optimize_command = actions["optimize"]
    optimize_command.add_argument(
        "--run-id", dest="run_ids", action="append", metavar="RUN_ID",
        help="only this run's partitions (repeatable; default: every complete run)",
    )  # fmt: skip
    optimize_command.add_argument(
        "--zorder", action="store_true",
        help="also Z-order the message-keyed tables by group and msg_id (docs/performance.md: "
        "no faster filters than compaction alone at 1M messages a run, and twice the time)",
    )  # fmt: skip
    vacuum_command = actions["vacuum"]
    vacuum_command.add_argument(
        "--retention",
        default=f"{DEFAULT_RETENTION_HOURS}h",
        help=f"keep what versions this recent need (default {DEFAULT_RETENTION_HOURS}h, Delta's)",
    )
    vacuum_command.add_argument("--dry-run", action="store_true", help="list, do not remove")
    vacuum_command.add_argument(
        "--force", action="store_true", help="allow a retention under the tables' own"
    )


def runs_command(args: argparse.Namespace) -> int:
    output = os.path.abspath(args.output)
    if not DeltaTable.is_deltatable(table_path(output, "runs")):
        raise ScenarioError("--output", f"no retrysim tables in {output} (no runs table)")
    if args.action == "list":
        runs = list_runs(output, args.scenario, args.status)
        if args.plan_id is not None:
            runs = [run for run in runs if (plan_of(run) or ("",))[0] == args.plan_id]
        filtered = args.scenario or args.status or args.plan_id
        print(_table(runs) if runs else f"no runs in {output}" + (
            " that match" if filtered else ""), flush=True)  # fmt: skip
    elif args.action == "show":
        print(_run_fields(output, find_run(output, args.run_id)), flush=True)
    elif args.action == "delete":
        find_run(output, args.run_id)  # before a Spark session starts for nothing
        removed = delete_run(output, args.run_id, say, committing_session(args))
        say(f"run {args.run_id}: deleted from {', '.join(removed)}")
    elif args.action == "optimize":
        for run_id in args.run_ids or []:  # before a Spark session starts for nothing
            find_run(output, run_id)
        done = optimize(output, args.run_ids, args.zorder, committing_session(args))
        say(f"optimize: {len(done)} tables compacted" if done else "optimize: no complete runs")
        for table, (removed, added) in done.items():
            say(f"  {table}: {removed} files rewritten as {added}")
    else:
        hours = _hours(args.retention)
        found = vacuum(output, hours, args.dry_run, args.force, committing_session(args))
        verb = "would remove" if args.dry_run else "removed"
        count = sum(len(files) for files in found.values())
        say(f"vacuum ({hours}h retention): {verb} {count} files no table version needs")
        for table, files in found.items():
            if files:
                say(f"  {table}: {len(files)} files")
    return EXIT_OK


COMMITTING = ("delete", "vacuum", "optimize")


def committing_session(args: argparse.Namespace) -> SparkSession | None:
    """A Spark session with Delta Lake where delta-spark is the sink, else None (delta-rs):
    what ``runs`` and ``plans`` commit their removals through."""
    if args.delta_sink == "delta-rs":
        return None
    check_spark(None, args.delta_sink)  # delta-spark asked for without its JARs: one line
    if not delta_jars_configured(SparkConf()):
        return None
    say(f"{args.command} {args.action}: through delta-spark (a local Spark session)")
    return build_session("retrysim-runs")


def _hours(text: str) -> int:
    try:
        milliseconds = parse_duration(text)
    except ValueError as error:
        raise ScenarioError("--retention", str(error)) from None
    if milliseconds % 3_600_000:
        raise ScenarioError("--retention", f"value {text!r}: use whole hours, e.g. 168h or 0h")
    return milliseconds // 3_600_000


_COLUMNS = ("run_id", "status", "scenario", "started_at", "tables", "groups", "messages",
            "deliveries", "dlq", "files", "bytes")  # fmt: skip


def _table(runs: list[RunInfo]) -> str:
    rows = [[shown(getattr(run, column)) for column in _COLUMNS] for run in runs]
    widths = [max(len(column), *(len(row[i]) for row in rows)) for i, column in enumerate(_COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(_COLUMNS, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


# What ``runs show`` prints after the runs row's columns: the run's sizes and files
_SIZES = ("groups", "messages", "deliveries", "dlq", "files", "bytes")


def _run_fields(output: str, run: RunInfo) -> str:
    """Every column of the run's ``runs`` row in the schema's order (``-`` for a run being
    written, which has none yet), ``config_json`` as indented JSON, then its sizes."""
    row = run_rows_by_id(output).get(run.run_id, {"run_id": run.run_id, "status": run.status})
    lines = []
    for name in RUNS.fieldNames():
        value = row.get(name)
        if name == "config_json" and value:
            lines.append(f"{name}:")
            lines.append(textwrap.indent(json.dumps(json.loads(value), indent=2), "  "))
        else:
            lines.append(f"{name}: {shown(value, grouped=False)}")  # a seed as given
    lines += [f"{name}: {shown(getattr(run, name))}" for name in _SIZES]
    return "\n".join(lines)


def shown(value: object, grouped: bool = True) -> str:
    """A cell as the commands print it: - for null, grouped digits, UTC times."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}" if grouped else str(value)
    if hasattr(value, "strftime"):
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)
