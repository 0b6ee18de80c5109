"""``retrysim runs list | show | delete | vacuum``: the runs under an output folder.

No Spark: the tables are read and committed with delta-rs on the driver
(:mod:`retrysim.store.runs`).
"""

from __future__ import annotations

import argparse
import os

from deltalake import DeltaTable

from retrysim.cli.common import EXIT_OK, say
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.units import parse_duration
from retrysim.store.runs import (
    DEFAULT_RETENTION_HOURS,
    RunInfo,
    delete_run,
    find_run,
    list_runs,
    vacuum,
)
from retrysim.store.sinks import table_path


def add_runs_command(commands: argparse._SubParsersAction) -> None:
    command = commands.add_parser("runs", help="list, show, delete or vacuum the runs of a folder")
    actions = command.add_subparsers(dest="action", required=True)
    for name, text in (
        ("list", "every run: status, scenario, sizes and times"),
        ("show", "one run, every field"),
        ("delete", "delete a run from every table (readers stop seeing it at once)"),
        ("vacuum", "remove the files no table version within the retention needs"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument("--output", default="out", help="folder of the Delta tables")
        if name in ("show", "delete"):
            action.add_argument("--run-id", required=True, help="the run")
    vacuum_command = actions.choices["vacuum"]
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
        runs = list_runs(output)
        print(_table(runs) if runs else f"no runs in {output}", flush=True)
    elif args.action == "show":
        run = find_run(output, args.run_id)
        for name, value in vars(run).items():
            print(f"{name}: {_shown(value)}", flush=True)
    elif args.action == "delete":
        removed = delete_run(output, args.run_id, say)
        say(f"run {args.run_id}: deleted from {', '.join(removed)}")
    else:
        hours = _hours(args.retention)
        found = vacuum(output, hours, dry_run=args.dry_run, force=args.force)
        verb = "would remove" if args.dry_run else "removed"
        count = sum(len(files) for files in found.values())
        say(f"vacuum ({hours}h retention): {verb} {count} files no table version needs")
        for table, files in found.items():
            if files:
                say(f"  {table}: {len(files)} files")
    return EXIT_OK


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
    rows = [[_shown(getattr(run, column)) for column in _COLUMNS] for run in runs]
    widths = [max(len(column), *(len(row[i]) for row in rows)) for i, column in enumerate(_COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(_COLUMNS, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def _shown(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if hasattr(value, "strftime"):
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)
