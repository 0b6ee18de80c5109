"""What every command shares: exit codes, the progress line, the output folder check and the
checks of Spark's settings before it starts."""

from __future__ import annotations

import argparse
import os
import sys

from deltalake import DeltaTable
from pyspark import SparkConf

from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.limits import MAX_REPLICATIONS
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


def say(line: str) -> None:
    """One progress line on stdout, as every command prints them."""
    print(f"retrysim: {line}", flush=True)


def add_scenario_options(command: argparse.ArgumentParser, set_help: str) -> None:
    """The options of the commands that run a scenario: --scenario, --output, --master, --set."""
    command.add_argument("--scenario", help="scenario YAML (default: conf/default.yaml)")
    command.add_argument(
        "--output", default="out", help="folder of the Delta tables (default: out)"
    )
    command.add_argument("--master", help="Spark master, e.g. local[2] (default: spark-submit's)")
    command.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=set_help
    )


def add_replications_option(command: argparse.ArgumentParser) -> None:
    """``--replications N``: the scenario (each plan point) under N seeds."""
    command.add_argument(
        "--replications",
        type=_replications,
        default=1,
        metavar="N",
        help=f"run each scenario under N seeds derived from its seed (1-{MAX_REPLICATIONS}; "
        "default 1): runs <id>-r1..rN, and each metric's mean and 95%% interval",
    )


def _replications(text: str) -> int:
    """An argparse type: argparse reports the option and exits with code 2."""
    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_REPLICATIONS:
        raise argparse.ArgumentTypeError(
            f"value {text!r}: must be a whole number within 1..{MAX_REPLICATIONS}"
        )
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
