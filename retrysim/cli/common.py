"""What every command shares: exit codes, the progress line, the output folder check and the
checks of Spark's settings before it starts."""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from deltalake import DeltaTable
from pyspark import SparkConf

from retrysim.cli.precheck import check_output_folder, log_file
from retrysim.engine.sizing import slowdown
from retrysim.scenario.errors import ScenarioError
from retrysim.session import check_master, delta_jars_configured, submitted_master
from retrysim.store.sinks import arrow_schema, table_path
from retrysim.tables.schemas import ALL_SCHEMAS

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def stderr_to_the_launcher() -> None:
    """Under spark-submit, whose Python runner merges the driver's stderr into its stdout,
    send ``sys.stderr`` to the launching JVM's own stderr (through Linux's /proc, appending),
    so that errors and warnings reach the terminal's stderr as they do without spark-submit;
    elsewhere, or where that cannot be opened, nothing changes."""
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return
    try:
        sys.stderr = open(f"/proc/{os.getppid()}/fd/2", "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    except OSError:
        return


# Whether this process is a command's own (a job, ``python -m retrysim``, the ``retrysim``
# script): only then do Python's warnings go to the run's log file, not in a notebook's or
# a test's process that calls the commands.
_OWN_PROCESS = {"claimed": False}


def claim_process() -> None:
    """Mark this process as the command's own (:func:`logs_to_file`)."""
    _OWN_PROCESS["claimed"] = True


def logs_to_file(output: str, command: str) -> str:
    """The file a run's logs go to, and in a command's own process Python's warnings from
    now on (PySpark's, pandas'), not between its progress lines: the one spark-submit.sh
    named (``RETRYSIM_LOG_FILE``), else a new one under the output folder, for a JVM the
    command starts itself."""
    path = os.environ.get("RETRYSIM_LOG_FILE") or log_file(output, command)
    if not _OWN_PROCESS["claimed"]:
        return path

    def to_the_log(message, category, filename, lineno, file=None, line=None) -> None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(warnings.formatwarning(message, category, filename, lineno, line))
        except OSError:
            pass

    warnings.showwarning = to_the_log
    return path


def say(line: str) -> None:
    """One progress line on stdout, as every command prints them."""
    print(f"retrysim: {line}", flush=True)


def check_output(output: str) -> str:
    """The output folder must be a writable directory (or creatable: precheck's
    :func:`check_output_folder`), and any table already in it must have the schema this
    version writes."""
    path = check_output_folder(output)
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


def check_spark(master: str | None, sink: str = "auto") -> None:
    """Startup problems Spark would meet only once started, as one-line errors before it
    starts: a master it cannot parse or that does not answer (the command's ``--master``,
    else spark-submit's), and a delta-spark sink without the Delta Lake classes (Spark would
    start first and fail at the first commit)."""
    check_master(master or submitted_master())
    if sink == "delta-spark" and not delta_jars_configured(SparkConf()):
        raise ScenarioError(
            "--delta-sink",
            "value 'delta-spark': the Delta Lake classes are not on the classpath (start Spark "
            "with --packages io.delta:delta-spark_2.13:<version> or its JARs), or use delta-rs "
            "or auto",
        )


def add_actions(
    commands: argparse._SubParsersAction, name: str, text: str, actions: dict[str, str]
) -> dict[str, argparse.ArgumentParser]:
    """A command of actions (``runs list``, ``plans delete``, ...), each reading the folder
    of its ``--output``; the actions' parsers by name, for their own options."""
    command = commands.add_parser(name, help=text)
    sub = command.add_subparsers(dest="action", required=True)
    parsers = {}
    for action, help_text in actions.items():
        parsers[action] = sub.add_parser(action, help=help_text, description=help_text)
        parsers[action].add_argument("--output", default="out", help="folder of the Delta tables")
    return parsers


def add_committing_sink(action: argparse.ArgumentParser) -> None:
    """``--delta-sink`` of an action that commits removals (runs and plans)."""
    action.add_argument(
        "--delta-sink",
        choices=("auto", "delta-rs", "delta-spark"),
        default="auto",
        help="auto: through delta-spark when its JARs are there, else delta-rs",
    )


def load_note(seconds: float, master: str | None) -> str:
    """A dry run's "about N s now" on a busy machine (empty on a quiet one)."""
    slower, load = slowdown(master)
    return f"; about {seconds * slower:.0f} s now (load {load:.1f})" if slower > 1 else ""


def add_metrics_arguments(
    command: argparse.ArgumentParser, group_help: str, group_required: bool
) -> None:
    """``--metrics FILE...``, ``--group`` and ``--topic``: the exported series of one group,
    as calibrate and compare read them."""
    command.add_argument("--metrics", nargs="+", required=True, metavar="FILE",
                         help="range-query JSON or Grafana CSV exports")  # fmt: skip
    command.add_argument("--group", required=group_required, help=group_help)
    command.add_argument("--topic", help="the group's topic (default: the one its series name)")
